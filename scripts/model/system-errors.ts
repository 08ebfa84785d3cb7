// One line for a failed file operation (EACCES, ENOSPC, a name too long, …): every command's entry point uses it,
// so that no bad input ends in a stack trace. No imports of the harness: cli.ts loads it.
import fs from "node:fs";
import path from "node:path";

export function noPermission(dir: string, code: string): string {
  return `没有权限在 ${dir} 里写入（${code}）：换一个你有写权限的位置，或先修改这个目录的权限。`;
}

/** Calls that create, rename or remove an entry: they need write permission on the folder holding it. */
const ENTRY_CALLS = new Set(["mkdir", "rename", "link", "symlink", "unlink", "rmdir", "open", "copyfile", "mkdtemp"]);

/** One line for a system error of a file operation, or undefined when `error` is not one. */
export function systemErrorLine(error: unknown): string | undefined {
  const e = error as NodeJS.ErrnoException & { dest?: string };
  if (!(error instanceof Error) || typeof e.code !== "string" || typeof e.syscall !== "string") return undefined;
  const where = e.dest ?? e.path ?? "";
  switch (e.code) {
    case "EACCES":
    case "EPERM":
      return noPermission(where && ENTRY_CALLS.has(e.syscall) ? path.dirname(where) : where || "目标位置", e.code);
    case "EROFS":
      return `${where} 所在的文件系统是只读的（EROFS）：换一个可写的位置。`;
    case "ENOSPC":
    case "EDQUOT":
      return `磁盘空间不足，写不进 ${where}（${e.code}）：清理出空间后重试。`;
    case "ENAMETOOLONG":
      return `路径太长（ENAMETOOLONG）：${where}。换一个短一些的目录名或位置。`;
    case "ENOTDIR":
      return `路径 ${where} 里有一段是文件而不是目录（ENOTDIR）：检查路径，换一个位置。`;
    case "ELOOP":
      return `路径 ${where} 里的符号链接绕成了圈（ELOOP）：修好或删掉这些链接。`;
    case "ENOENT":
      // The folder is there but refuses new entries (/proc, a removed working folder): not a typo in the path.
      if (where && ENTRY_CALLS.has(e.syscall) && fs.existsSync(path.dirname(where)))
        return `无法在 ${path.dirname(where)} 里创建文件或目录（ENOENT）：这个位置不接受新文件，换一个普通目录。`;
      return `找不到 ${where}（ENOENT）：检查路径是否拼写正确、是否被移走。`;
    case "EMFILE":
    case "ENFILE":
      return `打开的文件太多（${e.code}）：关掉一些程序后重试。`;
    default:
      return `${e.syscall} ${where} 失败（${e.code}）：${e.message}`;
  }
}
