// npm run pi -w @pi/course -- [参数] [提示词]
// 第 24 章的命令行。课程仓库里运行课程自己的 packages/pi-course/src/cli/pi.ts；第 24 章的练习目录里运行学习者自己的
// 那份；更早章节的练习目录里还没有这份代码，只打印一行：需要哪一章、怎样建那个练习目录（scripts/model/pi-command.ts）。
// 源码经 tsx 直接运行（不用先 build），工作目录是敲命令的地方（npm 的 INIT_CWD），退出码原样交回。
// Ctrl-C 由终端发给整个前台进程组：这里忽略它，让 CLI 自己决定中断这一轮还是退出，然后跟着它的退出码结束。
import { spawn } from "node:child_process";
import { ROOT, callerDir, isPracticeRoot } from "./model/paths.js";
import { piEntry, piUnavailable } from "./model/pi-command.js";
import { quotePath } from "./model/quote.js";

const refusal = piUnavailable(ROOT, isPracticeRoot());
if (refusal !== undefined) {
  console.error(refusal);
  process.exit(1);
}

let tsx: string;
try {
  tsx = import.meta.resolve("tsx");
} catch {
  console.error(`无法运行 pi：还没有安装依赖。先运行 cd ${quotePath(ROOT)} && npm install，再重试。`);
  process.exit(1);
}

const child = spawn(process.execPath, ["--import", tsx, piEntry(ROOT), ...process.argv.slice(2)], { cwd: callerDir(), stdio: "inherit" });
process.on("SIGINT", () => {});
for (const signal of ["SIGTERM", "SIGHUP"] as const) process.on(signal, () => child.kill(signal));
child.on("error", (error) => {
  console.error(`无法运行 pi：${error.message}`);
  process.exit(1);
});
child.on("exit", (code, signal) => process.exit(code ?? (signal === "SIGINT" ? 130 : 1)));
