// Runs node's test runner on behalf of a process that cannot (a test file), and prints the outcomes as JSON.
import { type WorkerRequest, runTests } from "./tests.js";

const request = JSON.parse(process.argv[2] ?? "{}") as WorkerRequest;
const outcomes = await runTests(request.root, request.files, {
  ...(request.patterns ? { patterns: request.patterns.map((source) => new RegExp(source)) } : {}),
  ...(request.timeout ? { timeout: request.timeout } : {}),
});
// A NUL separates anything a test printed to our stdout from the result.
process.stdout.write(`\u0000${JSON.stringify(outcomes)}`);
