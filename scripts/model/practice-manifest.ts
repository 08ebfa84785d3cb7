// The practice folder's own manifest, pi-practice.json, as the learner's commands read it. Kept apart from
// practice-tree.ts (which writes practice folders and needs git and fs-extra), because lab loads this on every run:
// a cold `lab` that pulled in simple-git and fs-extra spent about 0.14 s of CPU before it started the build.
import fs from "node:fs";
import type { Checkpoint, Edit, Fault } from "./manifest.js";
import { PRACTICE_MANIFEST, inTree } from "./paths.js";

/** What `lab` needs to know inside a practice folder (nothing here reveals the solution). */
export interface PracticeManifest {
  id: string;
  title: string;
  mode: string;
  parent: string;
  target: string;
  focusedTest: string;
  teachingFiles: string[];
  labs: Checkpoint["labs"];
  firstRed: string;
  /** The course checkout that made this folder: where course-only commands are to be run. */
  courseRoot?: string;
  /** The chapter's fault exercises; each mutation sealed (see sealMutation). */
  faults?: PracticeFault[];
  /** sha256 of every test file the folder was given, for the tamper check of `lab`. */
  tests?: Record<string, string>;
  /** The teaching files whose starter carries each lab's label: what `reset <lab>` restores. */
  labFiles?: Record<string, string[]>;
  /** Per starter file, where its holes sit (0-based line ranges of the starter) and the labs each names: what `reset <lab>` can put back alone. */
  holes?: Record<string, Array<{ start: number; end: number; labs: string[] }>>;
}

/** A fault as the practice folder carries it: everything but the mutation in the open. */
export type PracticeFault = Omit<Fault, "mutation"> & { sealed: string };

/**
 * The mutation quotes lines of the target's code. It travels base64-encoded so that opening pi-practice.json while
 * still working on the chapter does not show those lines at a glance; `fault` opens it once the chapter is green.
 */
export function sealMutation(mutation: Edit[]): string {
  return Buffer.from(JSON.stringify(mutation), "utf8").toString("base64");
}

export function unsealFault(fault: PracticeFault): Fault {
  const { sealed, ...rest } = fault;
  return { ...rest, mutation: JSON.parse(Buffer.from(sealed, "base64").toString("utf8")) as Edit[] };
}

/** The practice folder's own manifest (written by `practice`). */
export function readPracticeManifest(root: string): PracticeManifest {
  const raw = JSON.parse(fs.readFileSync(inTree(root, PRACTICE_MANIFEST), "utf8")) as PracticeManifest;
  return { ...raw, labs: raw.labs.map((lab) => ({ ...lab, hints: lab.hints ?? [] })) };
}

/** The one command a guide's fault section prints for a fault (verify checks the guides against it). */
export function faultCommand(id: string, faultId: string): string {
  return `npm run fault -w @pi/course -- ${id} ${faultId}`;
}
