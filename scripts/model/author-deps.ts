// Dependencies only course authors use: StrykerJS for `npm run mutate`; VitePress and mermaid for the course website
// (`npm run site`), playwright-core to test that website in a headless Chromium; the official openai and
// @anthropic-ai/sdk clients, which only test/wire-faithfulness.test.ts uses (to check that the loopback model servers
// speak the real wire formats). A practice folder copies the root package.json and package-lock.json so that its
// `npm install` gets exactly the course's versions; the author-only packages are taken out of both (the lock through
// fitLockfile, which also drops every package only they needed), so a learner's install never fetches them and finds
// the lock already as npm would write it.

/** Root devDependencies that stay out of practice folders. */
export const AUTHOR_ONLY_DEPENDENCIES = ["@stryker-mutator/core", "vitepress", "mermaid", "playwright-core", "openai", "@anthropic-ai/sdk"];

/** package.json without the author-only devDependencies (a copy; the input is not changed). */
export function learnerPackageJson<T extends Record<string, unknown>>(pkg: T, names: readonly string[] = AUTHOR_ONLY_DEPENDENCIES): T {
  const copy: Record<string, unknown> = { ...pkg };
  const dev = copy.devDependencies as Record<string, string> | undefined;
  if (dev) copy.devDependencies = Object.fromEntries(Object.entries(dev).filter(([name]) => !names.includes(name)));
  return copy as T;
}
