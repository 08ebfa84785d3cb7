#!/usr/bin/env node
// 第 24 章：pi-course 命令的入口。只接线：真实的进程环境、交互循环，然后按 runCli 给出的退出码结束。
import { processEnvironment, runCli } from "./main.js";
import { runInteractive } from "./interactive.js";

const code = await runCli(process.argv.slice(2), processEnvironment(), { interactive: runInteractive });
// 等 stdout 写完再退出：管道上的写入是异步的，直接 exit 会截掉最后几行。
process.stdout.write("", () => process.exit(code));
