#!/usr/bin/env node
// 第 24 章：npm 为 `pi-course` 命令链接的入口。它是一份不经编译的小文件（安装时就在，npm 才能给它加上执行权限），
// 只加载构建出来的 dist/src/cli/pi.js；还没有构建时说一行该做什么。
try {
  await import("../dist/src/cli/pi.js");
} catch (error) {
  if (error?.code === "ERR_MODULE_NOT_FOUND" && String(error.message).includes("dist/src/cli/pi.js")) {
    console.error("pi-course 还没有构建：先运行 npm run build -w @pi/course，再重试。");
    process.exit(1);
  }
  throw error;
}
