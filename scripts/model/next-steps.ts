// What comes after a green chapter in a practice folder: the fault exercises not yet run to the end here, then the
// acceptance questions. `lab <章>` and `progress` print the same lines, read from the same record (.pi-course/faults.json).
import { faultCommand, type PracticeManifest } from "./practice-manifest.js";
import { readFaultsDone } from "./practice-state.js";

export function nextStepsAfterGreen(root: string, practice: Pick<PracticeManifest, "id" | "faults">): string[] {
  const done = new Set(readFaultsDone(root).map((d) => d.id));
  const all = practice.faults ?? [];
  const open = all.filter((f) => !done.has(f.id));
  if (open.length === 0) {
    const names = all.map((f) => f.id).join("、");
    return [`故障练习都做过了${names ? `（${names}，红 → 绿）` : ""}。最后回答 GUIDE.md「验收清单」里的问题。`];
  }
  return [
    "下一步：故障练习（GUIDE.md「故障练习」），在这里运行：",
    ...open.map((f) => `  ${faultCommand(practice.id, f.id)}   # Lab ${f.lab}`),
    "然后回答 GUIDE.md「验收清单」里的问题。",
  ];
}
