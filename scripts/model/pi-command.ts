// Whether `npm run pi` can run in a tree (scripts/pi.ts): the course checkout and chapter-24 practice folders can;
// an earlier chapter's practice folder gets one line naming the chapter it needs and how to make that folder.
import fs from "node:fs";
import path from "node:path";
import { PACKAGE_DIR } from "./paths.js";
import { readPracticeManifest } from "./practice-manifest.js";
import { quotePath } from "./quote.js";

/** The first chapter that has the command line. */
export const CLI_CHAPTER = 24;

/** The command line's entry in a tree. */
export function piEntry(root: string): string {
  return path.join(root, PACKAGE_DIR, "src", "cli", "pi.ts");
}

/** undefined when `root` can run pi; otherwise the one line that says why not and what to do. */
export function piUnavailable(root: string, practice: boolean): string | undefined {
  const entry = piEntry(root);
  if (practice) {
    let id = "";
    let courseRoot: string | undefined;
    try {
      const manifest = readPracticeManifest(root);
      id = manifest.id;
      courseRoot = manifest.courseRoot;
    } catch {
      // an unreadable manifest: the line below still says which chapter is needed
    }
    if (id === "" || Number(id) < CLI_CHAPTER || !fs.existsSync(entry)) {
      const where = courseRoot !== undefined ? `cd ${quotePath(courseRoot)} && ` : "在课程仓库里运行 ";
      return `npm run pi 需要第 ${CLI_CHAPTER} 章的代码，这里是第 ${id || "?"} 章的练习目录；先建一个第 ${CLI_CHAPTER} 章的练习目录：${where}npm run practice -w @pi/course -- ${CLI_CHAPTER} ../pi-practice-${CLI_CHAPTER}`;
    }
    return undefined;
  }
  return fs.existsSync(entry) ? undefined : `这份检出里没有 ${path.relative(root, entry)}：npm run pi 需要第 ${CLI_CHAPTER} 章的代码。`;
}
