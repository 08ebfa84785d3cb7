// npm test's own runner (test/run.ts): which files it runs and in what order; and the order verify starts checkpoints in.
import test from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import { LONG_FIRST, ordered, testFiles } from "./run.js";
import { REPO, at } from "./harness-helpers.js";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { SLOWEST_FIRST, startOrder } from "../scripts/model/verify.js";

test("npm test 的运行器：每个根测试文件与每个编译后的章节测试恰好一次；耗时长的按列表先开始，其余按文件名", () => {
  const files = testFiles();
  const roots = fs.readdirSync(at(REPO, "test")).filter((name) => name.endsWith(".test.ts")).map((name) => `test/${name}`);
  const chapters = fs.readdirSync(at(REPO, "packages/pi-course/test")).filter((name) => name.endsWith(".test.ts"))
    .map((name) => `packages/pi-course/dist/test/${name.replace(/\.ts$/, ".js")}`);
  assert.deepEqual([...files].sort(), [...roots, ...chapters].sort(), "npm test 先构建，所以每个章节测试都有编译结果");
  // A renamed file must not silently drop out of the list: each entry is a real test file.
  for (const file of LONG_FIRST) assert.ok(files.includes(file), `LONG_FIRST 里的 ${file} 不是测试文件`);
  const order = ordered(files);
  assert.deepEqual([...order].sort(), [...files].sort());
  assert.deepEqual(order.slice(0, LONG_FIRST.length), LONG_FIRST);
  const rest = order.slice(LONG_FIRST.length);
  assert.deepEqual(rest, files.filter((file) => !LONG_FIRST.includes(file)), "其余的保持文件名顺序");
});

test("verify 的开始顺序：最慢的 checkpoint（SLOWEST_FIRST，第 24 章）先开始，其余按章节顺序；每个 checkpoint 恰好一次", () => {
  const checkpoints = loadCheckpoints();
  const ids = checkpoints.map((c) => c.id);
  for (const id of SLOWEST_FIRST) assert.ok(ids.includes(id), `SLOWEST_FIRST 里的 ${id} 不是 checkpoint`);
  assert.deepEqual(SLOWEST_FIRST[0], "24");
  const order = startOrder(checkpoints).map((index) => ids[index]!);
  assert.deepEqual([...order].sort(), [...ids].sort());
  assert.deepEqual(order.slice(0, SLOWEST_FIRST.length), SLOWEST_FIRST);
  assert.deepEqual(order.slice(SLOWEST_FIRST.length), ids.filter((id) => !SLOWEST_FIRST.includes(id)));
  // Only the ids count, not where the list starts: a selection without 24 keeps its own order.
  assert.deepEqual(startOrder([{ id: "03" }, { id: "01" }]), [0, 1]);
  assert.deepEqual(startOrder([{ id: "01" }, { id: "24" }, { id: "03" }]), [1, 0, 2]);
});
