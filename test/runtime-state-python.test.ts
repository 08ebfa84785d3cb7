// 第 20 章在一台没有 Python 的机器上：Lab 20.3 的三项测试必须失败（不是跳过），
// 失败原因只有一行，写明该安装什么。这里在最终树上运行编译好的聚焦测试，
// 用 PI_COURSE_PYTHON 指向一个不存在的文件、或者用一个找不到 python3 / python 的 PATH 模拟那台机器。
// 依赖 `npm test` 先构建出 packages/pi-course/dist（README 的测试命令就是这个顺序）。
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import fs from "fs-extra";
import { REPO, run, tempDir } from "./harness-helpers.js";

const COMPILED = "packages/pi-course/dist/test/20-runtime-state.test.js";

interface Tap { pass: number; fail: number; skip: number; todo: number; failures: { title: string; error: string }[] }

/** 读 node 的 TAP 输出：汇总数字，以及每个失败的标题和 error 行。 */
function readTap(stdout: string): Tap {
  const count = (name: string): number => Number(new RegExp(`^# ${name} (\\d+)$`, "m").exec(stdout)?.[1] ?? Number.NaN);
  const failures: Tap["failures"] = [];
  const lines = stdout.split("\n");
  lines.forEach((line, index) => {
    const match = /^not ok \d+ - (.*)$/.exec(line);
    if (!match) return;
    const error = lines.slice(index + 1, index + 12).find((next) => /^\s+error: /.test(next)) ?? "";
    failures.push({ title: match[1]!, error: error.replace(/^\s+error: /, "").replace(/^'|'$/g, "") });
  });
  return { pass: count("pass"), fail: count("fail"), skip: count("skipped"), todo: count("todo"), failures };
}

/** 整个聚焦测试文件，不加名字过滤：其余 lab 不需要 Python，应当照常通过。 */
async function runChapter(env: Record<string, string>): Promise<{ code: number | null; tap: Tap; stdout: string }> {
  assert.ok(fs.existsSync(path.join(REPO, COMPILED)), `缺少 ${COMPILED}：先运行 npm run build`);
  const result = await run(process.execPath, ["--test", "--test-reporter=tap", COMPILED], {
    cwd: REPO, env, timeoutMs: 60_000,
  });
  return { code: result.code, tap: readTap(result.stdout), stdout: result.stdout };
}

function assertLoudFailure(outcome: { code: number | null; tap: Tap; stdout: string }, expected: RegExp): void {
  const { code, tap, stdout } = outcome;
  assert.notEqual(code, 0, "没有 Python 时测试命令必须以非零状态结束");
  assert.equal(tap.fail, 3, stdout);
  assert.equal(tap.pass, 10, "不需要 Python 的 10 项测试照常通过");
  assert.equal(tap.skip + tap.todo, 0, "Python 测试从不跳过");
  assert.equal(tap.failures.length, 3);
  for (const failure of tap.failures) {
    assert.match(failure.title, /^Lab 20\.3 · /);
    assert.match(failure.error, expected, failure.title);
    assert.match(failure.error, /sudo apt-get install python3/, "失败消息要说清楚该安装什么");
    assert.ok(!failure.error.includes("\\n"), `失败消息只有一行：${failure.error}`);
  }
}

test("第 20 章：PI_COURSE_PYTHON 指向不存在的文件时，Lab 20.3 的三项测试都失败，消息只有一行安装提示", async () => {
  const scratch = await tempDir("no-python");
  try {
    const nowhere = path.join(scratch, "missing", "python3");
    const outcome = await runChapter({ PI_COURSE_PYTHON: nowhere });
    assertLoudFailure(outcome, new RegExp(`^PI_COURSE_PYTHON=${nowhere.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} 不是可执行文件：请安装 Python 3`));
  } finally {
    await fs.remove(scratch);
  }
});

test("第 20 章：PATH 上既没有 python3 也没有 python 时，同样失败而不是跳过", async () => {
  const scratch = await tempDir("no-python-path");
  try {
    const outcome = await runChapter({ PI_COURSE_PYTHON: "", PATH: scratch });
    assertLoudFailure(outcome, /^找不到 Python（试过 PI_COURSE_PYTHON、python3、python）：请安装 Python 3/);
  } finally {
    await fs.remove(scratch);
  }
});
