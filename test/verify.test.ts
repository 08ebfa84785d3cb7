// `npm run verify` inside `npm test`: one test per checkpoint, so node's summary counts the course itself.
import test, { after, before } from "node:test";
import assert from "node:assert/strict";
import fs from "fs-extra";
import { loadCheckpoints } from "../scripts/model/manifest.js";
import { type HistoryInfo, ensureHistory } from "../scripts/model/history.js";
import { type CheckpointVerdict, verifyAll, verifyCourseTable } from "../scripts/model/verify.js";
import { makeTempDir } from "../scripts/model/trees.js";
import { SHARED_OUTCOMES_ENV, TestReuse } from "../scripts/model/test-reuse.js";

const checkpoints = loadCheckpoints();
let info: HistoryInfo;
let work: string;
// As `npm run verify` does: two checkpoints at a time, one reuse record for the whole run (a test file runs again
// only when its inputs changed), shared with the other processes of the same npm test (test/run.ts names the
// folder). The first test starts them all; each test waits for its own checkpoint.
const reuse = new TestReuse(true, { shared: process.env[SHARED_OUTCOMES_ENV] });
let verdicts: Promise<CheckpointVerdict>[] | undefined;

before(async () => {
  info = await ensureHistory(checkpoints);
  work = await makeTempDir("verify-test");
});
after(async () => {
  await fs.remove(work);
});

for (const c of checkpoints) {
  test(`verify · checkpoint ${c.id} ${c.slug}：目标、练习、故障、固定值与无泄漏`, async () => {
    verdicts ??= verifyAll(checkpoints, info, work, reuse);
    const verdict = await verdicts[checkpoints.indexOf(c)]!;
    const report = verdict.findings.map((f) => `[${f.area}] ${f.message}`).join("\n");
    assert.equal(verdict.findings.length, 0, `checkpoint ${c.id}：\n${report}`);
  });
}

test("verify · COURSE.md 的章节表与清单一致", () => {
  assert.deepEqual(verifyCourseTable(checkpoints), []);
});
