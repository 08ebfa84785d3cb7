// A practice folder takes package-lock.json from the course's final tree, but packages/pi-course/package.json from
// the chapter's snapshot. When a later chapter adds a dependency (chapter 16 adds quickjs-wasi), the final lockfile
// records a package the snapshot does not declare, and `npm install` in an earlier chapter's folder would rewrite the
// lockfile: the learner's folder is dirty before they typed a line. fitLockfile removes from the lockfile what the
// snapshot's package.json does not ask for, and every installed package that nothing else still needs.

type Entry = Record<string, unknown> & { link?: boolean; resolved?: string };
export interface LockFile { packages?: Record<string, Entry>; [key: string]: unknown }

const DEPENDENCY_FIELDS = ["dependencies", "devDependencies", "optionalDependencies", "peerDependencies"] as const;

function names(entry: Entry | undefined, fields: readonly string[]): string[] {
  const found: string[] = [];
  for (const field of fields) {
    const value = entry?.[field];
    if (typeof value === "object" && value !== null) found.push(...Object.keys(value));
  }
  return found;
}

/** Where npm finds `name` for the package at `from`: its own node_modules first, then each enclosing one. */
function resolveFrom(packages: Record<string, Entry>, from: string, name: string): string | undefined {
  let base = from;
  for (;;) {
    const candidate = base === "" ? `node_modules/${name}` : `${base}/node_modules/${name}`;
    if (packages[candidate] !== undefined) return candidate;
    if (base === "") return undefined;
    const cut = base.lastIndexOf("/node_modules/");
    base = cut >= 0 ? base.slice(0, cut) : "";
  }
}

/**
 * The lockfile with `workspace`'s declared dependencies narrowed to `manifest`'s, and the installed packages
 * (`node_modules/…` entries) no longer reachable from the root, the workspaces or their links dropped. Nothing is
 * added: a dependency the lockfile does not know stays npm's business.
 */
export function fitLockfile(lock: LockFile, workspace: string, manifest: Record<string, unknown>): LockFile {
  const fitted = structuredClone(lock);
  const packages = fitted.packages;
  if (packages === undefined || packages[workspace] === undefined) return fitted;
  const entry = packages[workspace]!;
  for (const field of DEPENDENCY_FIELDS) {
    const recorded = entry[field];
    if (typeof recorded !== "object" || recorded === null) continue;
    const wanted = manifest[field];
    const kept = Object.fromEntries(
      Object.entries(recorded).filter(([name]) => typeof wanted === "object" && wanted !== null && Object.hasOwn(wanted, name)),
    );
    if (Object.keys(kept).length === 0) delete entry[field];
    else entry[field] = kept;
  }

  // A workspace's bin (chapter 24's pi-course) is recorded in the lockfile too: keep it only where the snapshot has it.
  if (manifest.bin === undefined) delete entry.bin;
  else entry.bin = structuredClone(manifest.bin);

  // Roots: the root package, every workspace (paths outside node_modules) and every link's target.
  const reachable = new Set<string>();
  const queue: string[] = [];
  const visit = (key: string): void => {
    if (reachable.has(key) || packages[key] === undefined) return;
    reachable.add(key);
    queue.push(key);
  };
  for (const key of Object.keys(packages)) {
    if (!key.startsWith("node_modules/") && !key.includes("/node_modules/")) visit(key);
    const value = packages[key]!;
    if (value.link === true) {
      visit(key);
      if (typeof value.resolved === "string") visit(value.resolved);
    }
  }
  while (queue.length > 0) {
    const key = queue.shift()!;
    const isProject = !key.startsWith("node_modules/") && !key.includes("/node_modules/");
    const fields = isProject ? DEPENDENCY_FIELDS : (["dependencies", "optionalDependencies", "peerDependencies"] as const);
    for (const name of names(packages[key], fields)) {
      const found = resolveFrom(packages, key, name);
      if (found !== undefined) visit(found);
    }
  }
  for (const key of Object.keys(packages)) if (!reachable.has(key)) delete packages[key];
  return fitted;
}
