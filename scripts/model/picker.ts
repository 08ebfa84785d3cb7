// The interactive side of checkpoint / practice / lab / reset: with a terminal on both ends and no chapter given,
// a picker (prompts) instead of the usage line. Without a TTY (CI, pipes, scripts) nothing here ever runs, so those
// commands behave exactly as before.
import prompts from "prompts";
import { CourseError, cancelExit } from "./cli.js";
import type { Checkpoint, Lab } from "./manifest.js";
import type { ProgressState } from "./progress.js";

export { interactive } from "./cli.js";

/** Ctrl-C or Esc in a prompt: stop with one line, nothing done. */
function cancelled(): never {
  throw new CourseError("已取消，什么也没有做。", cancelExit());
}

async function ask<T>(question: Omit<prompts.PromptObject, "name">): Promise<T> {
  const answer = await prompts({ ...question, name: "value" }, { onCancel: cancelled });
  if (!("value" in answer)) cancelled();
  return answer.value as T;
}

export async function pickChapter(checkpoints: Checkpoint[], message: string): Promise<Checkpoint> {
  const id = await ask<string>({
    type: "select",
    message,
    hint: "↑↓ 选择，回车确认，Esc 取消",
    choices: checkpoints.map((c) => ({
      title: `${c.id} · ${c.title}`,
      description: `${c.mode} · ${c.labs.length} 个 lab，${c.labs.reduce((sum, lab) => sum + lab.count, 0)} 项测试`,
      value: c.id,
    })),
  });
  return checkpoints.find((c) => c.id === id)!;
}

/** The state of one lab as the last runs in this folder left it. */
function labState(lab: Lab, progress: ProgressState | undefined): string {
  const seen = progress?.labs[lab.id];
  if (!seen) return "还没运行过";
  return seen.passed === seen.expected ? `✓ ${seen.passed}/${seen.expected}` : `✗ ${seen.passed}/${seen.expected}`;
}

/** A lab of the chapter, or the whole chapter (the value is then the chapter number alone). */
export async function pickLab(chapterId: string, labs: Lab[], progress?: ProgressState): Promise<string> {
  const next = labs.findIndex((lab) => { const s = progress?.labs[lab.id]; return !s || s.passed < s.expected; });
  return ask<string>({
    type: "select",
    message: `第 ${chapterId} 章：运行哪一个 lab？`,
    hint: "↑↓ 选择，回车确认，Esc 取消",
    initial: Math.max(0, next),
    choices: [
      ...labs.map((lab) => ({ title: `Lab ${lab.id} · ${lab.title}`, description: labState(lab, progress), value: lab.id })),
      { title: "整章验收", description: "所有 lab，最后一行是 chapter total", value: String(Number(chapterId)) },
    ],
  });
}

export async function askFolder(initial: string): Promise<string> {
  const folder = await ask<string>({
    type: "text",
    message: "练习目录放在哪里？（相对于你现在所在的目录）",
    initial,
    validate: (value: string) => (value.trim() === "" ? "目录不能为空" : true),
  });
  return folder.trim();
}

export async function confirm(message: string, initial = true): Promise<boolean> {
  return ask<boolean>({ type: "confirm", message, initial });
}

/** One of several answers (reset: only this lab's holes, whole files, or nothing). */
export async function choose<T extends string>(message: string, choices: Array<{ title: string; value: T }>, initial = 0): Promise<T> {
  return ask<T>({ type: "select", message, hint: "↑↓ 选择，回车确认，Esc 取消", initial, choices });
}
