// The checkpoint model: one JSON manifest per chapter, validated on load.
// A bad manifest is reported with its file and the exact field that is wrong.
import path from "node:path";
import fs from "node:fs"; // not fs-extra: the lab loop loads these modules on every run
import { CHECKPOINTS_DIR, PACKAGE_DIR, ROOT, isPracticeRoot } from "./paths.js";
import { CourseError } from "./cli.js";

export type Mode = "重建" | "扩展" | "观察";
export const MODES: readonly Mode[] = ["重建", "扩展", "观察"];

export interface StarterOverlay { source: string; destination: string; description: string }
/** A lab; `hints` is its hint ladder: where to look, the signature and invariant, pseudocode (never the code). */
export interface Lab { id: string; title: string; count: number; tests: string[]; hints: string[] }
export interface Edit { find: string; replace: string }
export interface Fault {
  id: string; lab: string; file: string; description: string; mutation: Edit[]; test: string;
}
export interface OptionalExercise { id: string; title: string; summary: string }
export interface Pins { parent: string; target: string }

export interface Manifest {
  id: string;
  slug: string;
  title: string;
  subject: string;
  mode: Mode;
  fileModes: Record<string, Mode>;
  teachingFiles: string[];
  starters: StarterOverlay[];
  focusedTest: string;
  fixtures: string[];
  heldOutTests: string[];
  labs: Lab[];
  firstRed: string;
  prerequisites: string[];
  firstStep: string;
  faults: Fault[];
  optionalExercises: OptionalExercise[];
  pins: Pins;
}

export interface Checkpoint extends Manifest {
  /** Folder name under checkpoints/, `${id}-${slug}`. */
  folder: string;
  /** Absolute path of the manifest file. */
  file: string;
  /** Repository-relative path of the chapter guide. */
  guide: string;
  /** Repository-relative path of the reverse step (target → parent). */
  reversePatch: string;
}

export const MANIFEST_NAME = "checkpoint.json";
export const REVERSE_PATCH_NAME = "reverse.patch";

class Reader {
  constructor(readonly file: string) {}
  fail(field: string, problem: string): never {
    throw new CourseError(`清单无效：${path.relative(ROOT, this.file)} 的字段 ${field} ${problem}`);
  }
  object(value: unknown, field: string): Record<string, unknown> {
    if (typeof value !== "object" || value === null || Array.isArray(value)) this.fail(field, "必须是对象");
    return value as Record<string, unknown>;
  }
  string(value: unknown, field: string, options: { empty?: boolean } = {}): string {
    if (typeof value !== "string") this.fail(field, "必须是字符串");
    if (!options.empty && value.trim() === "") this.fail(field, "不能为空");
    return value;
  }
  array<T>(value: unknown, field: string, item: (value: unknown, field: string) => T): T[] {
    if (!Array.isArray(value)) this.fail(field, "必须是数组");
    return value.map((entry, index) => item(entry, `${field}[${index}]`));
  }
  repoPath(value: unknown, field: string): string {
    const text = this.string(value, field);
    if (text.startsWith("/") || text.includes("\\") || text.split("/").some((part) => part === ".." || part === "."))
      this.fail(field, `必须是仓库内的相对路径（用 / 分隔）：${text}`);
    return text;
  }
}

export function parseManifest(raw: unknown, file: string): Manifest {
  const r = new Reader(file);
  const m = r.object(raw, "(根)");
  const known = new Set([
    "id", "slug", "title", "subject", "mode", "fileModes", "teachingFiles", "starters", "focusedTest", "fixtures",
    "heldOutTests", "labs", "firstRed", "prerequisites", "firstStep", "faults", "optionalExercises", "pins",
  ]);
  for (const key of Object.keys(m)) if (!known.has(key)) r.fail(key, "不是清单认识的字段");

  const id = r.string(m.id, "id");
  if (!/^\d{2}$/.test(id)) r.fail("id", `必须是两位数字，现在是 "${id}"`);
  const chapter = String(Number(id));
  const slug = r.string(m.slug, "slug");
  if (!/^[a-z0-9]+(-[a-z0-9]+)*$/.test(slug)) r.fail("slug", `只能用小写字母、数字和连字符：${slug}`);
  const subject = r.string(m.subject, "subject");
  if (!subject.startsWith(`course(${id}): `)) r.fail("subject", `必须以 "course(${id}): " 开头`);
  const mode = r.string(m.mode, "mode") as Mode;
  if (!MODES.includes(mode)) r.fail("mode", `必须是 ${MODES.join(" / ")} 之一`);
  if ((mode === "观察") !== (id === "00")) r.fail("mode", "只有 00 使用 观察，其余章节不能使用");

  const fileModes: Record<string, Mode> = {};
  if (m.fileModes !== undefined) {
    for (const [key, value] of Object.entries(r.object(m.fileModes, "fileModes"))) {
      if (!MODES.includes(value as Mode)) r.fail(`fileModes.${key}`, `必须是 ${MODES.join(" / ")} 之一`);
      fileModes[key] = value as Mode;
    }
  }
  const teachingFiles = r.array(m.teachingFiles, "teachingFiles", (v, f) => r.repoPath(v, f));
  if (teachingFiles.length === 0) r.fail("teachingFiles", "至少要有一份教学文件");
  for (const key of Object.keys(fileModes))
    if (!teachingFiles.includes(key)) r.fail(`fileModes.${key}`, "不是本章的教学文件");

  const starters = r.array(m.starters, "starters", (v, f) => {
    const s = r.object(v, f);
    const source = r.repoPath(s.source, `${f}.source`);
    if (!source.startsWith(`starters/${id}-`)) r.fail(`${f}.source`, `必须位于 starters/ 且以 ${id}- 开头`);
    const destination = r.repoPath(s.destination, `${f}.destination`);
    if (!teachingFiles.includes(destination)) r.fail(`${f}.destination`, "必须是本章的一份教学文件");
    return { source, destination, description: r.string(s.description, `${f}.description`) };
  });
  if (mode === "观察" && starters.length > 0) r.fail("starters", "观察模式的章节没有脚手架");
  if (mode !== "观察" && starters.length === 0) r.fail("starters", "重建章节至少要有一份脚手架");

  const focusedTest = r.repoPath(m.focusedTest, "focusedTest");
  if (focusedTest !== `packages/pi-course/test/${id}-${slug}.test.ts`)
    r.fail("focusedTest", `必须是 packages/pi-course/test/${id}-${slug}.test.ts`);
  const fixtures = m.fixtures === undefined ? [] : r.array(m.fixtures, "fixtures", (v, f) => r.repoPath(v, f));
  const heldOutTests = m.heldOutTests === undefined ? [] : r.array(m.heldOutTests, "heldOutTests", (v, f) => r.repoPath(v, f));

  const labs = r.array(m.labs, "labs", (v, f) => {
    const l = r.object(v, f);
    const labId = r.string(l.id, `${f}.id`);
    if (!new RegExp(`^${chapter}\\.\\d+$`).test(labId)) r.fail(`${f}.id`, `必须形如 ${chapter}.1`);
    const count = l.count;
    if (typeof count !== "number" || !Number.isInteger(count) || count < 1) return r.fail(`${f}.count`, "必须是正整数");
    const tests = r.array(l.tests, `${f}.tests`, (t, tf) => {
      const title = r.string(t, tf);
      if (!title.startsWith(`Lab ${labId} · `)) r.fail(tf, `必须以 "Lab ${labId} · " 开头`);
      return title;
    });
    if (tests.length !== count) r.fail(`${f}.tests`, `列出了 ${tests.length} 个测试，但 count 是 ${count}`);
    const hints = l.hints === undefined ? [] : r.array(l.hints, `${f}.hints`, (h, hf) => r.string(h, hf));
    if (l.hints !== undefined && hints.length !== 3)
      r.fail(`${f}.hints`, `提示阶梯必须正好三级（看哪里、签名与不变量、伪代码），现在是 ${hints.length} 级`);
    return { id: labId, title: r.string(l.title, `${f}.title`), count, tests, hints };
  });
  if (labs.length === 0) r.fail("labs", "至少要有一个 lab");
  labs.forEach((lab, index) => {
    if (lab.id !== `${chapter}.${index + 1}`) r.fail(`labs[${index}].id`, `应为 ${chapter}.${index + 1}（按顺序编号）`);
  });
  const allTitles = labs.flatMap((lab) => lab.tests);
  const duplicate = allTitles.find((title, index) => allTitles.indexOf(title) !== index);
  if (duplicate) r.fail("labs", `测试标题重复：${duplicate}`);

  // 观察 has nothing to rebuild, so it has no first red either.
  const firstRed = r.string(m.firstRed, "firstRed", { empty: mode === "观察" });
  if (mode !== "观察" && !(firstRed.startsWith(`Lab ${chapter}.1 `) && firstRed.endsWith("尚未实现")))
    r.fail("firstRed", `必须形如 "Lab ${chapter}.1 … 尚未实现"`);

  const faults = r.array(m.faults, "faults", (v, f) => {
    const x = r.object(v, f);
    const lab = r.string(x.lab, `${f}.lab`);
    if (!labs.some((l) => l.id === lab)) r.fail(`${f}.lab`, `不是本章的 lab：${lab}`);
    const test = r.string(x.test, `${f}.test`);
    if (!allTitles.includes(test)) r.fail(`${f}.test`, `不是本章清单里的测试标题：${test}`);
    if (!test.startsWith(`Lab ${lab} · `)) r.fail(`${f}.test`, `应属于 Lab ${lab}`);
    const mutation = r.array(x.mutation, `${f}.mutation`, (e, ef) => {
      const edit = r.object(e, ef);
      return { find: r.string(edit.find, `${ef}.find`), replace: r.string(edit.replace, `${ef}.replace`, { empty: true }) };
    });
    if (mutation.length === 0) r.fail(`${f}.mutation`, "至少要有一处修改");
    const faultId = r.string(x.id, `${f}.id`);
    if (!/^[a-z0-9]+(-[a-z0-9]+)*$/.test(faultId)) r.fail(`${f}.id`, `只能用小写字母、数字和连字符：${faultId}`);
    return {
      id: faultId, lab, file: r.repoPath(x.file, `${f}.file`), description: r.string(x.description, `${f}.description`),
      mutation, test,
    };
  });
  if (faults.length === 0) r.fail("faults", "每章至少要有一个故障练习");

  const optionalExercises = m.optionalExercises === undefined ? [] : r.array(m.optionalExercises, "optionalExercises", (v, f) => {
    const o = r.object(v, f);
    return { id: r.string(o.id, `${f}.id`), title: r.string(o.title, `${f}.title`), summary: r.string(o.summary, `${f}.summary`) };
  });
  const pinsRaw = r.object(m.pins, "pins");
  const pins = {
    parent: r.string(pinsRaw.parent, "pins.parent", { empty: true }),
    target: r.string(pinsRaw.target, "pins.target", { empty: true }),
  };
  for (const key of ["parent", "target"] as const)
    if (pins[key] !== "" && !/^[0-9a-f]{40}$/.test(pins[key])) r.fail(`pins.${key}`, "必须是 40 位十六进制提交 id 或空字符串");

  return {
    id, slug, title: r.string(m.title, "title"), subject, mode, fileModes, teachingFiles, starters, focusedTest,
    fixtures, heldOutTests, labs, firstRed,
    prerequisites: r.array(m.prerequisites, "prerequisites", (v, f) => r.string(v, f)),
    firstStep: r.string(m.firstStep, "firstStep"), faults, optionalExercises, pins,
  };
}

export function readManifest(file: string): Manifest {
  let raw: unknown;
  try {
    raw = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (error) {
    throw new CourseError(`清单无法读取：${path.relative(ROOT, file)}：${(error as Error).message}`);
  }
  return parseManifest(raw, file);
}

/** Every checkpoint under checkpoints/, in chapter order, validated, ids contiguous from 00. */
export function loadCheckpoints(dir = CHECKPOINTS_DIR): Checkpoint[] {
  if (!fs.existsSync(dir)) {
    throw new CourseError(isPracticeRoot()
      ? "这是练习目录：checkpoint / practice / fault / verify / history 只能在课程仓库里运行；这里请用 npm run lab -w @pi/course -- <章.lab>。"
      : "这里没有 checkpoints/ 目录：这个命令只能在课程仓库里运行。");
  }
  const folders = fs.readdirSync(dir).filter((name) => /^\d{2}-/.test(name)).sort();
  const checkpoints = folders.map((folder): Checkpoint => {
    const file = path.join(dir, folder, MANIFEST_NAME);
    if (!fs.existsSync(file)) throw new CourseError(`清单缺失：checkpoints/${folder}/${MANIFEST_NAME}`);
    const manifest = readManifest(file);
    if (folder !== `${manifest.id}-${manifest.slug}`)
      throw new CourseError(`清单无效：checkpoints/${folder}/${MANIFEST_NAME} 的 id/slug 与目录名不一致（应为 ${manifest.id}-${manifest.slug}）`);
    return {
      ...manifest, folder, file,
      guide: `checkpoints/${folder}/README.md`,
      reversePatch: `checkpoints/${folder}/${REVERSE_PATCH_NAME}`,
    };
  });
  checkpoints.forEach((checkpoint, index) => {
    if (Number(checkpoint.id) !== index)
      throw new CourseError(`清单无效：checkpoints/${checkpoint.folder} 的 id 不连续（应为 ${String(index).padStart(2, "0")}）`);
  });
  return checkpoints;
}

/** "9" / "09" / "9.1" / "09.1" → { id: "09", lab?: "9.1" }. */
export function parseChapterArg(arg: string | undefined): { id: string; lab?: string } | undefined {
  const match = /^(\d{1,2})(?:\.(\d+))?$/.exec(arg ?? "");
  if (!match) return undefined;
  const id = match[1]!.padStart(2, "0");
  return match[2] === undefined ? { id } : { id, lab: `${Number(match[1])}.${Number(match[2])}` };
}

export function findCheckpoint(checkpoints: Checkpoint[], arg: string | undefined, usage: string): Checkpoint {
  const parsed = parseChapterArg(arg);
  if (!parsed) throw new CourseError(`${usage}\n可用的章节：${checkpoints.map((c) => c.id).join(" ")}`, 2);
  const found = checkpoints.find((c) => c.id === parsed.id);
  if (!found) throw new CourseError(`找不到 checkpoint ${arg}；可用的章节：${checkpoints.map((c) => c.id).join(" ")}`, 2);
  return found;
}

/** Files a chapter adds or changes, in the order the manifest lists them. */
export function declaredFiles(c: Manifest): string[] {
  return [...c.teachingFiles, c.focusedTest, ...c.fixtures, ...c.heldOutTests];
}

export function chapterNumber(c: Pick<Manifest, "id">): string {
  return String(Number(c.id));
}

/** Id of the chapter before `c` ("09" → "08"); the parent of checkpoint 00 is course/base instead. */
export function previousId(c: Pick<Manifest, "id">): string {
  return String(Number(c.id) - 1).padStart(2, "0");
}

export function totalTests(c: Pick<Manifest, "labs">): number {
  return c.labs.reduce((sum, lab) => sum + lab.count, 0);
}

/** The glob a learner types for the compiled focused test, e.g. packages/pi-course/dist/test/13-*.test.js. */
export function focusedGlob(id: string): string {
  return `${PACKAGE_DIR}/dist/test/${id}-*.test.js`;
}

/** Anchored pattern for one lab ("Lab 13.1 · ", never "Lab 13.10"). */
export function labPattern(labId: string): RegExp {
  return new RegExp(`^Lab ${labId.replace(".", "\\.")} · `);
}
