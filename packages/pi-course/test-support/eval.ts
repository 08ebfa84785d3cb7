// 第 14 章 · 评测外壳：站在 Runtime 外面，把“一次完整运行”变成一份只含枚举和计数的报告。
//
// 一个 eval case 的一生：
//   检查 case 形状 → prepare（每次都新建）→ prompt + flush → 读 entries 与 active leaf
//   → 取活动路径 → 协议扫描 → 与 result 逐项比对 → 只读声明过的文件 → 冻结的观察交给 judge
//   → 无论前面怎样结束，都 dispose 再 cleanup。
// 第一个失败的步骤决定报告的主失败；之后的 dispose / cleanup 失败只能追加为次要失败。
// 报告里不出现任何原始文本：错误消息、prompt、文件名与内容、路径、callId 都不离开这个文件。

import { isDeepStrictEqual } from "node:util";
import type { AgentRunResult } from "../src/agent-loop.js";
import type { Runtime } from "../src/composition.js";
import { pathTo, type SessionEntry } from "../src/session.js";
import type { AgentMessage } from "../src/types.js";

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
// 小工具
// ---------------------------------------------------------------------------

/** 协议扫描的代码子集：它们全部归 protocol 阶段、protocol_failed 状态。 */
type ProtocolCode = Extract<
  EvalFailureCode,
  | "missing_user_interaction"
  | "incomplete_user_interaction"
  | "assistant_without_user"
  | "tool_call_without_user"
  | "duplicate_tool_call"
  | "orphan_tool_result"
  | "duplicate_tool_result"
  | "tool_name_mismatch"
  | "unpaired_tool_call"
>;

function statusOf(phase: EvalFailurePhase): EvalStatus {
  if (phase === "protocol") return "protocol_failed";
  if (phase === "task") return "task_failed";
  return "infra_failed";
}

function emptyEvidence(requested: number): SafeEvidence {
  return {
    messages: { system: 0, user: 0, assistant: 0, toolResult: 0 },
    tools: { calls: 0, results: 0, errors: 0 },
    files: { requested, read: 0 },
    checks: { passed: 0, failed: 0 },
  };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null;
}

function isNonBlankString(value: unknown): value is string {
  return typeof value === "string" && value.trim() !== "";
}

/** case 的形状在调用任何回调之前检查；不合格就不 prepare。 */
function isValidCase(value: unknown): value is EvalCase {
  if (!isObject(value)) return false;
  if (!isNonBlankString(value.id) || typeof value.prompt !== "string") return false;
  if (typeof value.prepare !== "function" || typeof value.judge !== "function") return false;
  const files: unknown = value.files;
  if (!Array.isArray(files)) return false;
  const seen = new Set<string>();
  // 用下标遍历：稀疏数组的空位也要被当成不合格的文件名。
  for (let index = 0; index < files.length; index += 1) {
    const file: unknown = files[index];
    if (!isNonBlankString(file) || seen.has(file)) return false;
    seen.add(file);
  }
  return true;
}

/** 读 case 的公开字段时也不信任它：取值本身抛错就当作没有。 */
function safeRead<T>(read: () => T, fallback: T): T {
  try {
    return read();
  } catch {
    return fallback;
  }
}

/** prepare 的返回值必须是对象，带一个 runtime 对象和一个 readFile 函数。 */
function isPrepared(value: unknown): value is PreparedEval {
  return isObject(value) && isObject(value.runtime) && typeof value.readFile === "function";
}

/** 递归冻结：judge 对观察的任何写入都会在严格模式下抛 TypeError。 */
function deepFreeze<T>(value: T): T {
  if (isObject(value) && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const key of Reflect.ownKeys(value)) deepFreeze((value as Record<PropertyKey, unknown>)[key]);
  }
  return value;
}

function messagesOf(path: readonly SessionEntry[]): AgentMessage[] {
  const messages: AgentMessage[] = [];
  for (const entry of path) if (entry.type === "message") messages.push(entry.message);
  return messages;
}

/** 证据只数数：各角色消息、toolCall 块、工具结果及其中的错误。 */
function countPath(messages: readonly AgentMessage[], evidence: SafeEvidence): void {
  for (const message of messages) {
    if (message.role === "system") evidence.messages.system += 1;
    else if (message.role === "user") evidence.messages.user += 1;
    else if (message.role === "assistant") {
      evidence.messages.assistant += 1;
      const content: readonly unknown[] = Array.isArray(message.content) ? message.content : [];
      for (const block of content) if (isObject(block) && block.type === "toolCall") evidence.tools.calls += 1;
    } else if (message.role === "toolResult") {
      evidence.messages.toolResult += 1;
      evidence.tools.results += 1;
      if (message.isError === true) evidence.tools.errors += 1;
    }
  }
}

/**
 * 顺序协议扫描（system 整条跳过）。比第 11 章的分组更严：
 * 每一轮必须以 user 开始、至少有一条 assistant；一个 call 的结果必须在下一条 assistant 或 user 之前出现，
 * 名字要对得上，同一个 callId 在整条路径上只能出现一次，结果也只能出现一次。
 */
function scanProtocol(messages: readonly AgentMessage[]): ProtocolCode | undefined {
  let sawUser = false;
  let open: { answered: boolean } | undefined;
  const calls = new Map<string, { name: string; matched: boolean }>();
  let unmatched = 0;

  for (const message of messages) {
    if (message.role === "system") continue;
    if (message.role === "user") {
      if (open !== undefined && !open.answered) return "incomplete_user_interaction";
      if (unmatched > 0) return "unpaired_tool_call";
      sawUser = true;
      open = { answered: false };
      continue;
    }
    if (message.role === "assistant") {
      if (open === undefined) return "assistant_without_user";
      if (unmatched > 0) return "unpaired_tool_call";
      open.answered = true;
      for (const block of message.content) {
        if (block.type !== "toolCall") continue;
        if (calls.has(block.id)) return "duplicate_tool_call";
        calls.set(block.id, { name: block.name, matched: false });
        unmatched += 1;
      }
      continue;
    }
    if (message.role === "toolResult") {
      const call = open === undefined ? undefined : calls.get(message.toolCallId);
      if (call === undefined) return "orphan_tool_result";
      if (call.matched) return "duplicate_tool_result";
      if (call.name !== message.toolName) return "tool_name_mismatch";
      call.matched = true;
      unmatched -= 1;
      continue;
    }
    // 解析过的 entry 不会有第五种 role；万一出现，按无法配对处理。
    return "orphan_tool_result";
  }

  if (!sawUser) return "missing_user_interaction";
  if (open !== undefined && !open.answered) return "incomplete_user_interaction";
  if (unmatched > 0) return "unpaired_tool_call";
  return undefined;
}

/** verdict 的形状与一致性：passed 是布尔值，checks 全是布尔值，且 passed === 全部为 true。 */
function isValidVerdict(value: unknown): value is TaskVerdict {
  if (!isObject(value) || typeof value.passed !== "boolean") return false;
  const checks: unknown = value.checks;
  if (!Array.isArray(checks) || !checks.every((check) => typeof check === "boolean")) return false;
  return value.passed === checks.every(Boolean);
}

// ---------------------------------------------------------------------------
// runEvalCase / runEvalSuite
// ---------------------------------------------------------------------------

export async function runEvalCase(evalCase: EvalCase): Promise<EvalReport> {
  const candidate: unknown = evalCase;
  const id = safeRead(() => (isObject(candidate) && typeof candidate.id === "string" ? candidate.id : ""), "");
  const requested = safeRead(
    () => (isObject(candidate) && Array.isArray(candidate.files) ? candidate.files.length : 0),
    0,
  );
  // 同一个报告对象贯穿始终：提前返回之后，finally 里的 dispose / cleanup 仍然写进它。
  const report: EvalReport = { id, status: "passed", evidence: emptyEvidence(requested), secondaryFailures: [] };

  const fail = (phase: EvalFailurePhase, code: EvalFailureCode): void => {
    if (report.primaryFailure === undefined) {
      report.primaryFailure = { phase, code };
      report.status = statusOf(phase);
    } else {
      report.secondaryFailures.push({ phase, code });
    }
  };

  if (!safeRead(() => isValidCase(candidate), false)) {
    fail("prepare", "invalid_case");
    return report;
  }

  let prepared: unknown;
  try {
    try {
      prepared = await evalCase.prepare();
    } catch {
      fail("prepare", "prepare_failed");
      return report;
    }
    const shaped = prepared;
    if (!safeRead(() => isPrepared(shaped), false)) {
      fail("prepare", "prepare_failed");
      return report;
    }
    await observeAndJudge(evalCase, prepared as PreparedEval, report, fail);
    return report;
  } finally {
    // 拿到什么就收拾什么：先 dispose Runtime，再清理工作区；两者的失败都不覆盖主失败。
    if (isObject(prepared) && isObject(prepared.runtime)) {
      const runtime = prepared.runtime as unknown as Runtime;
      try {
        await runtime.dispose();
      } catch {
        fail("dispose", "dispose_failed");
      }
    }
    if (isObject(prepared) && typeof prepared.cleanup === "function") {
      const workspace = prepared as unknown as PreparedEval;
      try {
        await workspace.cleanup?.();
      } catch {
        fail("cleanup", "cleanup_failed");
      }
    }
  }
}

/** 执行、收集、协议、judge：每一步失败都只记一个固定代码然后停下。 */
async function observeAndJudge(
  evalCase: EvalCase,
  prepared: PreparedEval,
  report: EvalReport,
  fail: (phase: EvalFailurePhase, code: EvalFailureCode) => void,
): Promise<void> {
  const { runtime } = prepared;
  const evidence = report.evidence;

  // 1. 执行：prompt 之后还要 flush，确认本轮 entries 已被 Store 接受。
  let result: AgentRunResult;
  try {
    result = await runtime.prompt(evalCase.prompt);
    await runtime.flush();
  } catch {
    fail("execute", "execute_failed");
    return;
  }

  // 2. 收集：读全部 entries 与当前 leaf。
  let all: SessionEntry[];
  let leaf: string | null;
  try {
    all = await runtime.session.entries();
    leaf = runtime.getActiveLeafId();
  } catch {
    fail("collect", "collect_failed");
    return;
  }
  if (typeof leaf !== "string") {
    fail("protocol", "missing_active_leaf");
    return;
  }

  // 3. 只取 leaf 的祖先链；兄弟分支从这里开始就不存在了。
  let activePath: SessionEntry[];
  try {
    activePath = pathTo(all, leaf);
  } catch {
    fail("protocol", "invalid_active_path");
    return;
  }
  const messages = messagesOf(activePath);
  countPath(messages, evidence);

  // 4. 协议扫描，然后要求活动路径与 Runtime 交回的 result 完全一致。
  const violation = scanProtocol(messages);
  if (violation !== undefined) {
    fail("protocol", violation);
    return;
  }
  const resultMessages: unknown = isObject(result) ? result.messages : undefined;
  if (!isDeepStrictEqual(messages, resultMessages)) {
    fail("protocol", "result_session_mismatch");
    return;
  }

  // 5. 逐个读取声明过的文件，一次只读一个。
  const files: Record<string, string> = {};
  for (const file of evalCase.files) {
    let value: unknown;
    try {
      value = await prepared.readFile(file);
    } catch {
      fail("collect", "collect_failed");
      return;
    }
    if (typeof value !== "string") {
      fail("collect", "collect_failed");
      return;
    }
    Object.defineProperty(files, file, { value, enumerable: true, writable: true, configurable: true });
    evidence.files.read += 1;
  }

  // 6. 观察是一份独立副本，并且整棵冻结。
  let observation: EvalObservation;
  try {
    observation = deepFreeze(structuredClone({ result, entries: activePath, files }));
  } catch {
    fail("collect", "collect_failed");
    return;
  }

  // 7. judge 与 verdict。
  let verdict: unknown;
  try {
    verdict = await evalCase.judge(observation);
  } catch {
    fail("judge", "judge_failed");
    return;
  }
  const judged = verdict;
  if (!safeRead(() => isValidVerdict(judged), false)) {
    fail("judge", "invalid_verdict");
    return;
  }
  const valid = verdict as TaskVerdict;
  for (const check of valid.checks) {
    if (check) evidence.checks.passed += 1;
    else evidence.checks.failed += 1;
  }
  if (!valid.passed) fail("task", "task_rejected");
}

/** 严格串行、保持输入顺序；同一个 case 对象出现几次就完整 prepare 几次。 */
export async function runEvalSuite(cases: readonly EvalCase[]): Promise<EvalReport[]> {
  const reports: EvalReport[] = [];
  for (const evalCase of cases) reports.push(await runEvalCase(evalCase));
  return reports;
}
