// What to run next, said the same way by every command: after a green chapter in a practice folder, the fault
// exercises not yet run to the end there, then the acceptance questions (`lab <章>` and `progress` print the same
// lines, read from the same record, .pi-course/faults.json); and the command that runs one lab on the learner's code.
import { faultCommand, type PracticeManifest } from "./practice-manifest.js";
import { readFaultsDone } from "./practice-state.js";
import { livePracticeFolders } from "./progress.js";
import { quotePath } from "./quote.js";

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

/**
 * The command that runs one lab on the learner's own code from `root`. In a course checkout `lab` runs the course's
 * answer, so the command goes into the learner's newest practice folder of that chapter (or says how to make one).
 */
export function labCommandHere(root: string, inPractice: boolean, id: string, lab: string): string {
  const command = `npm run lab -w @pi/course -- ${lab}`;
  if (inPractice) return command;
  const folders = livePracticeFolders(root).filter((r) => r.id === id).map((r) => r.dir);
  if (folders.length > 0) return `在你的练习目录里：cd ${quotePath(folders[folders.length - 1]!)} && ${command}`;
  return `在你的练习目录里运行 ${command}；还没有的话先建一个：npm run practice -w @pi/course -- ${id} ../pi-practice-${id}`;
}
