// fitLockfile: a practice folder's lockfile is narrowed to the snapshot's package.json, so that `npm install` in an
// earlier chapter's folder does not rewrite it because a later chapter added a dependency.
import test from "node:test";
import assert from "node:assert/strict";
import { fitLockfile, type LockFile } from "../scripts/model/lockfile.js";

function lockfile(): LockFile {
  return {
    name: "pi-course",
    lockfileVersion: 3,
    packages: {
      "": { name: "pi-course", workspaces: ["packages/pi-course"], devDependencies: { tsx: "^4" } },
      "node_modules/@pi/course": { resolved: "packages/pi-course", link: true },
      "node_modules/tsx": { version: "4.0.0", dependencies: { shared: "1" } },
      "node_modules/shared": { version: "1.0.0" },
      "node_modules/late": { version: "2.0.0", dependencies: { "late-helper": "1", shared: "1" } },
      "node_modules/late/node_modules/late-helper": { version: "1.0.0" },
      "node_modules/late-only": { version: "1.0.0" },
      "packages/pi-course": { name: "@pi/course", version: "0.1.0", dependencies: { late: "2.0.0", "late-only": "1.0.0" } },
    },
  };
}

test("较晚章节才加入的依赖从练习目录的 lockfile 里去掉，连同只有它需要的包；共用的包留下", () => {
  const fitted = fitLockfile(lockfile(), "packages/pi-course", { name: "@pi/course", dependencies: { "late-only": "1.0.0" } });
  assert.deepEqual(Object.keys(fitted.packages!), [
    "", "node_modules/@pi/course", "node_modules/tsx", "node_modules/shared", "node_modules/late-only", "packages/pi-course",
  ]);
  assert.deepEqual(fitted.packages!["packages/pi-course"], { name: "@pi/course", version: "0.1.0", dependencies: { "late-only": "1.0.0" } });

  const bare = fitLockfile(lockfile(), "packages/pi-course", { name: "@pi/course" });
  assert.deepEqual(bare.packages!["packages/pi-course"], { name: "@pi/course", version: "0.1.0" }, "空的依赖字段整个去掉");
  assert.equal(bare.packages!["node_modules/late-only"], undefined);
});

test("package.json 与 lockfile 一致时原样保留，输入不被改动", () => {
  const original = lockfile();
  const copy = structuredClone(original);
  const fitted = fitLockfile(original, "packages/pi-course", { dependencies: { late: "2.0.0", "late-only": "1.0.0" } });
  assert.deepEqual(fitted, copy);
  assert.deepEqual(original, copy);
});
