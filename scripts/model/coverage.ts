// Coverage of a chapter's teaching files under the chapter's tests, measured with c8: the test processes run with
// NODE_V8_COVERAGE pointing at a temporary folder, c8 turns V8's raw counts into istanbul data (through the source
// maps tsc writes next to dist/), and we read line and branch figures and uncovered line ranges per teaching file.
import fs from "node:fs";
import path from "node:path";
import { Report } from "c8";
import { inTree } from "./paths.js";

export interface FileCoverage {
  file: string;
  lines: { covered: number; total: number };
  branches: { covered: number; total: number };
  /** Uncovered lines merged into ranges, e.g. [[12, 14], [40, 40]]. */
  uncovered: Array<[number, number]>;
}

interface Position { line: number }
interface IstanbulFile {
  statementMap: Record<string, { start: Position; end: Position }>;
  s: Record<string, number>;
  b: Record<string, number[]>;
}

/** Line and branch figures of one istanbul file record. */
export function summarise(file: string, data: IstanbulFile): FileCoverage {
  const hits = new Map<number, number>();
  for (const [id, range] of Object.entries(data.statementMap)) {
    const line = range.start.line;
    hits.set(line, Math.max(hits.get(line) ?? 0, data.s[id] ?? 0));
  }
  const missed = [...hits].filter(([, count]) => count === 0).map(([line]) => line).sort((a, b) => a - b);
  const uncovered: Array<[number, number]> = [];
  for (const line of missed) {
    const last = uncovered[uncovered.length - 1];
    if (last && line === last[1] + 1) last[1] = line;
    else uncovered.push([line, line]);
  }
  const branchCounts = Object.values(data.b).flat();
  return {
    file,
    lines: { covered: hits.size - missed.length, total: hits.size },
    branches: { covered: branchCounts.filter((count) => count > 0).length, total: branchCounts.length },
    uncovered,
  };
}

/**
 * Turns the raw V8 coverage in `rawDir` into figures for `teachingFiles` (repository paths under `root`).
 * A teaching file no test loaded at all is reported with zero covered lines and no figures to show.
 */
export async function teachingCoverage(root: string, rawDir: string, teachingFiles: string[]): Promise<FileCoverage[]> {
  const reportDir = path.join(rawDir, "report");
  await new Report({
    tempDirectory: rawDir,
    reportsDirectory: reportDir,
    reporter: ["json"],
    include: ["**/packages/pi-course/dist/src/**", "**/packages/pi-course/dist/test-support/**"],
    exclude: [],
    allowExternal: true,
    excludeNodeModules: true,
  }).run();
  const finalFile = path.join(reportDir, "coverage-final.json");
  const all = fs.existsSync(finalFile) ? JSON.parse(fs.readFileSync(finalFile, "utf8")) as Record<string, IstanbulFile> : {};
  const byPath = new Map(Object.entries(all).map(([file, data]) => [path.resolve(file), data]));
  return teachingFiles.map((file) => {
    const data = byPath.get(path.resolve(inTree(root, file)));
    return data ? summarise(file, data) : { file, lines: { covered: 0, total: 0 }, branches: { covered: 0, total: 0 }, uncovered: [] };
  });
}

function percent(part: { covered: number; total: number }): string {
  return part.total === 0 ? "—" : `${((100 * part.covered) / part.total).toFixed(1)} %`;
}

/** `scope` says which tests ran: the whole chapter's, or one lab's (whose tests load only part of the files). */
export function formatCoverage(files: FileCoverage[], scope: { chapter: string; lab?: string }): string {
  const ran = scope.lab ? `只运行 Lab ${scope.lab} 的测试时` : `运行第 ${scope.chapter} 章全部测试时`;
  const lines = [`覆盖率（c8，${ran}教学文件被执行到的部分）：`];
  for (const f of files) {
    if (f.lines.total === 0) {
      lines.push(`  ${f.file}：${scope.lab ? `Lab ${scope.lab} 的测试没有加载它（整章运行时可能会）` : "没有任何测试加载它"}`);
      continue;
    }
    lines.push(`  ${f.file}：行 ${percent(f.lines)}（${f.lines.covered}/${f.lines.total}），分支 ${percent(f.branches)}（${f.branches.covered}/${f.branches.total}）`);
    lines.push(f.uncovered.length === 0
      ? "    没有未覆盖的行"
      : `    未覆盖的行：${f.uncovered.map(([a, b]) => (a === b ? `${a}` : `${a}-${b}`)).join("、")}`);
  }
  return lines.join("\n");
}
