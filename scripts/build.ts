// npm run build -w @pi/course (in a practice folder) — tsc on the package, as `tsc -p tsconfig.json` would run it.
// It goes through the harness so that a build before `npm install` says what to do (scripts/launch.js does that),
// and a type error ends with one line saying what comes next instead of npm's error block.
import { CourseError, main, rejectUnknownOptions } from "./model/cli.js";
import { ROOT } from "./model/paths.js";
import { buildPackage } from "./model/tests.js";

await main(async (args) => {
  rejectUnknownOptions(args);
  if (args.length > 0) throw new CourseError("用法：npm run build -w @pi/course", 2);
  const build = await buildPackage(ROOT);
  if (build.output.trim() !== "") process.stdout.write(build.output.endsWith("\n") ? build.output : `${build.output}\n`);
  if (!build.ok) throw new CourseError("构建失败：先修好上面的类型错误（文件:行:列），再重新运行 npm run build -w @pi/course。");
  return 0;
});
