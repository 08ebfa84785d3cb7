// 第 14 章学习脚手架 · 评测外壳（放在 test-support/eval.ts）。
//
// 公开类型已经写好，它们就是本章的契约：一份报告只能由枚举和计数组成。
// 两个函数还没有实现，调用时会抛出 `Lab 14.M … 尚未实现`。按 lab 顺序把它们补完：
//   Lab 14.1 runEvalCase 的生命周期：case 形状 → prepare（每次都新建）→ prompt + flush
//            → entries / active leaf → 活动路径 → 只读声明的文件 → 冻结的观察交给 judge → dispose → cleanup；
//   Lab 14.2 在同一个函数里加上 verdict 校验与顺序协议扫描（system 跳过），以及路径与 result 的逐项比对；
//   Lab 14.3 只含计数的 SafeEvidence、收尾失败只追加不覆盖，以及串行的 runEvalSuite。
// 可能用到的现成工具：第 10 章的 pathTo()、node:util 的 isDeepStrictEqual()、structuredClone()、Object.freeze()。

import type { AgentRunResult } from "../src/agent-loop.js";
import type { Runtime } from "../src/composition.js";
import type { SessionEntry } from "../src/session.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

export type Awaitable<T> = T | Promise<T>;

/** prepare() 交回的一次性工作区：一个全新的 Runtime，加上读取结果文件与收尾的办法。 */
export interface PreparedEval {
  runtime: Runtime;
  readFile(file: string): Awaitable<string>;
  cleanup?(): Awaitable<void>;
}

export interface PassingTaskVerdict {
  passed: true;
  checks: readonly boolean[];
}

export interface FailingTaskVerdict {
  passed: false;
  checks: readonly boolean[];
}

/** judge 的结论：passed 必须恰好等于“每一项检查都为 true”。 */
export type TaskVerdict = PassingTaskVerdict | FailingTaskVerdict;

/** judge 能看到的全部东西：结果、活动路径上的 entries、声明过的文件。整棵对象都被冻结。 */
export interface EvalObservation {
  readonly result: AgentRunResult;
  readonly entries: readonly SessionEntry[];
  readonly files: Readonly<Record<string, string>>;
}

export interface EvalCase {
  id: string;
  prompt: string;
  /** 运行结束后允许读取的文件；没有列出的文件 judge 永远看不到。 */
  files: readonly string[];
  prepare(): Awaitable<PreparedEval>;
  judge(observation: EvalObservation): Awaitable<TaskVerdict>;
}

export type EvalStatus = "passed" | "task_failed" | "protocol_failed" | "infra_failed";

export type EvalFailurePhase =
  | "prepare"
  | "execute"
  | "collect"
  | "protocol"
  | "judge"
  | "task"
  | "dispose"
  | "cleanup";

export type EvalFailureCode =
  | "invalid_case"
  | "prepare_failed"
  | "execute_failed"
  | "collect_failed"
  | "missing_active_leaf"
  | "invalid_active_path"
  | "missing_user_interaction"
  | "incomplete_user_interaction"
  | "result_session_mismatch"
  | "assistant_without_user"
  | "tool_call_without_user"
  | "duplicate_tool_call"
  | "orphan_tool_result"
  | "duplicate_tool_result"
  | "tool_name_mismatch"
  | "unpaired_tool_call"
  | "judge_failed"
  | "invalid_verdict"
  | "task_rejected"
  | "dispose_failed"
  | "cleanup_failed";

export interface EvalFailure {
  phase: EvalFailurePhase;
  code: EvalFailureCode;
}

/** 允许离开评测器的证据：只有计数。 */
export interface SafeEvidence {
  messages: { system: number; user: number; assistant: number; toolResult: number };
  tools: { calls: number; results: number; errors: number };
  files: { requested: number; read: number };
  checks: { passed: number; failed: number };
}

export interface EvalReport {
  id: string;
  status: EvalStatus;
  evidence: SafeEvidence;
  primaryFailure?: EvalFailure;
  secondaryFailures: EvalFailure[];
}

// ---------------------------------------------------------------------------
// 待实现
// ---------------------------------------------------------------------------

function labError(lab: string): Error {
  return new Error(`${lab} 尚未实现`);
}

/**
 * Lab 14.1–14.3：运行一个 case，永远返回报告而不是抛错。
 * - case 形状不对（id 空白、prompt 不是字符串、files 不是互不重复的非空字符串数组、prepare/judge 不是函数）
 *   → infra_failed / prepare:invalid_case，并且不调用 prepare；
 * - 每一步失败只记一个固定的 phase:code 然后停下，第一处失败就是主失败；
 * - 报告的 id 是公开的，其余只能是枚举和计数：错误消息、prompt、文件名和内容、路径、callId 都不能出现；
 * - 不管在哪一步结束，只要拿到了 Runtime 就 dispose，再调用工作区的 cleanup；
 *   它们失败时，已有主失败就追加到 secondaryFailures，否则自己成为主失败（infra_failed）。
 */
export async function runEvalCase(evalCase: EvalCase): Promise<EvalReport> {
  throw labError("Lab 14.1 runEvalCase");
}

/** Lab 14.3：按输入顺序一个接一个运行（上一个完全收尾后才 prepare 下一个）；同一个 case 对象出现几次就运行几次。 */
export async function runEvalSuite(cases: readonly EvalCase[]): Promise<EvalReport[]> {
  throw labError("Lab 14.3 runEvalSuite");
}
