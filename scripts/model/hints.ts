// The hint ladder: three rungs per lab, written in the manifest, climbed one at a time in a practice folder.
// What the learner has seen is kept in the folder itself (`.pi-course/hints.json`, ignored by its git).
import fs from "node:fs";
import path from "node:path";
import { STATE_DIR } from "./practice-state.js";

export const HINT_RUNGS = ["看哪里", "签名与不变量", "伪代码"] as const;
const HINT_FILE = "hints.json";

export interface HintState { seen: Record<string, number> }

export function readHintState(root: string): HintState {
  const file = path.join(root, STATE_DIR, HINT_FILE);
  try {
    const raw = JSON.parse(fs.readFileSync(file, "utf8")) as { seen?: unknown };
    const seen: Record<string, number> = {};
    if (raw.seen && typeof raw.seen === "object") {
      for (const [lab, count] of Object.entries(raw.seen)) {
        if (typeof count === "number" && Number.isInteger(count) && count >= 0) seen[lab] = Math.min(count, HINT_RUNGS.length);
      }
    }
    return { seen };
  } catch {
    return { seen: {} }; // no file yet, or one the learner broke by hand: start the ladder again
  }
}

export function writeHintState(root: string, state: HintState): void {
  const dir = path.join(root, STATE_DIR);
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, HINT_FILE);
  const temp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(temp, `${JSON.stringify(state, null, 2)}\n`);
  fs.renameSync(temp, file);
}

/**
 * Lines of `code` long enough to be telling (after trimming) that appear inside `rung`: a rung must describe, not quote.
 * Short lines (`}`, `return;`, an import) are too common to count.
 */
export function quotedCodeLines(rung: string, code: string, minLength = 24): string[] {
  const flat = rung.replace(/\s+/g, " ");
  return [...new Set(code.split("\n").map((line) => line.trim().replace(/\s+/g, " ")))]
    .filter((line) => line.length >= minLength && !line.startsWith("//") && !line.startsWith("*") && flat.includes(line));
}
