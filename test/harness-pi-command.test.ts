// `npm run pi`: the course checkout and a chapter-24 practice folder run the command line; an earlier chapter's
// practice folder gets one line naming chapter 24 and the command that makes its practice folder. A workspace bin
// (chapter 24's pi-course) stays in a practice folder's lockfile only where that chapter's package.json declares it.
import test from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fitLockfile, type LockFile } from "../scripts/model/lockfile.js";
import { ROOT } from "../scripts/model/paths.js";
import { CLI_CHAPTER, piEntry, piUnavailable } from "../scripts/model/pi-command.js";

function practiceRoot(t: test.TestContext, id: string, withEntry: boolean): string {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "pi-course-pi-command-"));
  t.after(() => fs.rmSync(root, { recursive: true, force: true }));
  fs.writeFileSync(path.join(root, "pi-practice.json"), JSON.stringify({ id, courseRoot: "/srv/pi course", labs: [] }));
  if (withEntry) {
    fs.mkdirSync(path.dirname(piEntry(root)), { recursive: true });
    fs.writeFileSync(piEntry(root), "// learner's entry\n");
  }
  return root;
}

test("课程仓库与第 24 章的练习目录能运行 pi；更早章节的练习目录只得到一行：需要第 24 章，以及怎样建那个练习目录", (t) => {
  assert.equal(CLI_CHAPTER, 24);
  assert.equal(piUnavailable(ROOT, false), undefined, "课程仓库有 src/cli/pi.ts");
  assert.equal(piUnavailable(practiceRoot(t, "24", true), true), undefined);
  const line = piUnavailable(practiceRoot(t, "23", false), true);
  assert.ok(line !== undefined);
  assert.equal(line.includes("\n"), false);
  assert.match(line, /需要第 24 章/);
  assert.match(line, /第 23 章的练习目录/);
  assert.match(line, /cd '\/srv\/pi course' && npm run practice -w @pi\/course -- 24 /);
  assert.match(piUnavailable(practiceRoot(t, "24", false), true) ?? "", /需要第 24 章/, "没有入口文件的目录同样说明");
});

test("工作区的 bin 只在快照的 package.json 声明它时留在 lockfile 里", () => {
  const lock: LockFile = {
    packages: {
      "": { name: "pi-course", workspaces: ["packages/pi-course"] },
      "node_modules/@pi/course": { resolved: "packages/pi-course", link: true },
      "packages/pi-course": { name: "@pi/course", version: "0.1.0", bin: { "pi-course": "bin/pi-course.js" } },
    },
  };
  assert.equal(fitLockfile(lock, "packages/pi-course", { name: "@pi/course" }).packages!["packages/pi-course"]!.bin, undefined);
  assert.deepEqual(
    fitLockfile(lock, "packages/pi-course", { name: "@pi/course", bin: { "pi-course": "bin/pi-course.js" } }).packages!["packages/pi-course"]!.bin,
    { "pi-course": "bin/pi-course.js" },
  );
});

test("npm run pi 在敲命令的目录里工作：项目级的 models.json 从 INIT_CWD 读（目录受信任时），而不是从 packages/pi-course", (t) => {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), "pi-course-pi-cwd-"));
  t.after(() => fs.rmSync(base, { recursive: true, force: true }));
  const home = path.join(base, "home");
  const caller = path.join(base, "project");
  fs.mkdirSync(home);
  fs.mkdirSync(path.join(caller, ".pi-course"), { recursive: true });
  fs.writeFileSync(path.join(caller, ".pi-course", "models.json"), JSON.stringify({
    providers: { "here-only": { api: "openai-completions", baseUrl: "http://127.0.0.1:9/v1", apiKeyEnv: null, models: [{ id: "m", contextWindow: 1000, maxTokens: 100 }] } },
  }));
  const env: NodeJS.ProcessEnv = { ...process.env, HOME: home, INIT_CWD: caller };
  delete env.NODE_TEST_CONTEXT;
  const listModels = () => spawnSync(process.execPath, [path.join(ROOT, "scripts", "launch.js"), "pi", "--list-models"], {
    cwd: path.join(ROOT, "packages", "pi-course"), env, encoding: "utf8",
  });
  // 项目级的 models.json 只在受信任的目录里读；不受信任时 stderr 说一行，指明的正是 INIT_CWD 那个目录里的文件。
  const untrusted = listModels();
  assert.equal(untrusted.status, 0, untrusted.stderr);
  assert.doesNotMatch(untrusted.stdout, /here-only/);
  assert.ok(untrusted.stderr.includes(path.join(caller, ".pi-course", "models.json")), untrusted.stderr);
  fs.mkdirSync(path.join(home, ".pi-course"), { recursive: true });
  fs.writeFileSync(path.join(home, ".pi-course", "trusted.json"), JSON.stringify({ folders: [caller] }));
  const result = listModels();
  assert.equal(result.status, 0, result.stderr);
  assert.match(result.stdout, /here-only\/m {2}openai-completions/);
});
