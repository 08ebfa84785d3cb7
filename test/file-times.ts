// Loaded into every test file's process by npm test, as quiet-mock-timers.ts is (node's runner starts each file with
// the runner's own --import flags). It does nothing unless PI_COURSE_TEST_TIMES names a folder: then each process
// writes there, as it exits, how long it lived and the CPU time it used — its own and that of every child process it
// waited for (the compilers and test processes a verify starts), read from /proc where there is one. test/run.ts
// turns the records into a table of the slowest files (`npm run bench -- --npm-test` prints it).
import fs from "node:fs";
import path from "node:path";

export const TEST_TIMES_ENV = "PI_COURSE_TEST_TIMES";

export interface FileTime {
  /** The script the process ran (a test file's absolute path, or test/run.ts for the runner itself). */
  file: string;
  pid: number;
  ppid: number;
  wallMs: number;
  cpuMs: number;
}

/** CPU time (ms) of the children this process waited for: fields 16 and 17 of /proc/self/stat, in clock ticks. */
function childrenCpuMs(): number {
  try {
    const stat = fs.readFileSync("/proc/self/stat", "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // fields[0] is field 3 (state); cutime and cstime are fields 16 and 17. Linux reports them at 100 ticks a second.
    return (Number(fields[13]) + Number(fields[14])) * 10;
  } catch {
    return 0;
  }
}

const dir = process.env[TEST_TIMES_ENV];
if (dir !== undefined && dir !== "") {
  process.on("exit", () => {
    const own = process.cpuUsage();
    const record: FileTime = {
      file: process.argv[1] ?? "",
      pid: process.pid,
      ppid: process.ppid,
      wallMs: Math.round(performance.now()),
      cpuMs: Math.round((own.user + own.system) / 1000 + childrenCpuMs()),
    };
    try {
      fs.writeFileSync(path.join(dir, `${process.pid}.json`), JSON.stringify(record));
    } catch {
      // The folder is gone: nothing to record into.
    }
  });
}
