// npm run docs — regenerates the chapter table in COURSE.md from the manifests.
import fs from "fs-extra";
import { main } from "./model/cli.js";
import { COURSE_FILE, renderCourse } from "./model/docs.js";
import { loadCheckpoints } from "./model/manifest.js";
import { ROOT, inTree } from "./model/paths.js";

await main(async () => {
  const file = inTree(ROOT, COURSE_FILE);
  const before = await fs.readFile(file, "utf8");
  const after = renderCourse(before, loadCheckpoints());
  if (after === before) console.log(`${COURSE_FILE} 的章节表已是最新。`);
  else {
    await fs.writeFile(file, after);
    console.log(`已更新 ${COURSE_FILE} 的章节表。`);
  }
});
