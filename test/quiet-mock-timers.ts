// Loaded into every test file's process by npm test (`node --import ./test/quiet-mock-timers.ts test/run.ts`: node's
// runner starts each file with the runner's own --import flags). It drops exactly one warning: node 20 announces
// "The MockTimers API is an experimental feature" once in each process whose tests fake setTimeout (chapters 08, 20
// and 21 do, so that a timeout provably fires after the step it must follow). Every other warning still prints.
const emit = process.emitWarning.bind(process);
process.emitWarning = ((warning: string | Error, ...rest: unknown[]): void => {
  const type = typeof rest[0] === "string" ? rest[0] : (rest[0] as { type?: string } | undefined)?.type ?? (warning instanceof Error ? warning.name : undefined);
  const text = warning instanceof Error ? warning.message : warning;
  if (type === "ExperimentalWarning" && /^The MockTimers API is an experimental feature/.test(text)) return;
  (emit as (...args: unknown[]) => void)(warning, ...rest);
}) as typeof process.emitWarning;
