// npm run history [-- --pin | --export [REF] | --check]
// Builds the teaching history in .history/ from the repository's content alone and prints its ids.
//   --pin           also write the ids into every manifest's "pins"
//   --export [REF]  author path: turn the (edited) chain at REF in .history (default: its HEAD) back into
//                   checkpoints/*/reverse.patch + the final tree, then rebuild and pin
//   --check         exit 1 when a manifest's pins differ from the rebuilt history
import { CourseError, main, rejectUnknownOptions, takeFlag } from "./model/cli.js";
import { loadCheckpoints } from "./model/manifest.js";
import { type HistoryInfo, ensureHistory, exportHistory, stalePins, writePins } from "./model/history.js";

function describe(info: HistoryInfo, checkpoints: ReturnType<typeof loadCheckpoints>): string {
  const lines = [`教学历史：${info.dir}（分支 course，标签 course/base 与 course/NN）`, `  base  ${info.base}`];
  for (const c of checkpoints) lines.push(`  ${c.id}    ${info.chapters.get(c.id)!.target}  ${c.subject}`);
  return lines.join("\n");
}

await main(async (args) => {
  const pin = takeFlag(args, "--pin");
  const check = takeFlag(args, "--check");
  const exportIndex = args.indexOf("--export");
  let exportRef: string | undefined;
  if (exportIndex >= 0) {
    exportRef = args[exportIndex + 1] && !args[exportIndex + 1]!.startsWith("--") ? args[exportIndex + 1]! : "HEAD";
    args.splice(exportIndex, exportRef === args[exportIndex + 1] ? 2 : 1);
  }
  rejectUnknownOptions(args);
  if (args.length > 0) throw new CourseError("用法：npm run history [-- --pin | --export [REF] | --check]", 2);
  let checkpoints = loadCheckpoints();

  if (exportRef !== undefined) {
    const written = await exportHistory(checkpoints, exportRef);
    console.log(`已从 .history 的 ${exportRef} 导出：\n${written.map((w) => `  ${w}`).join("\n")}`);
  }
  const info = await ensureHistory(checkpoints, { log: console.log });
  console.log(describe(info, checkpoints));
  if (pin || exportRef !== undefined) {
    const changed = await writePins(checkpoints, info);
    console.log(changed.length === 0 ? "固定值已是最新。" : `已更新固定值：checkpoint ${changed.join("、")}`);
    checkpoints = loadCheckpoints();
  }
  const stale = stalePins(checkpoints, info);
  if (stale.length > 0) {
    console.log(`清单里的固定值与历史不一致：checkpoint ${stale.join("、")}。运行 npm run history -- --pin 更新。`);
    if (check) return 1;
  }
  return 0;
});
