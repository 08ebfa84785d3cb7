// 四个指标：运维看板上只放这四个，多了反而干扰判断。全部从任务日志（第 21 章的存储）算出来，不另设计数器：
//
//   任务成功率          completed 数 ÷ 提交数（还没结束的任务也算在分母里：它们还没有成功）
//   单任务平均成本      按任务类型分组：每个任务执行树上的估算费用与 token 之和，再取平均
//   端到端时延 P95      created 事件到终态事件的时长，最近秩法（排好序后第 ⌈0.95·n⌉ 个）
//   人工介入率          至少有一次“需要人”的任务 ÷ 提交数
//
// 指标之间的参考线也来自同一张配置清单：成功率低于 90 % 说明系统有问题，人工介入率超过 3 % 说明自愈与重试还不够。
// 这些函数都是纯函数：同一份日志永远得到同一张表。

import { isTerminal } from "../task-runtime/task-state.js";
import { buildSpanTree, DEFAULT_PRICES, type PriceTable, type TaskRecord } from "./spans.js";

// ---------------------------------------------------------------------------
// 公开类型
// ---------------------------------------------------------------------------

export interface TypeCost {
  tasks: number;
  /** 估算费用的平均值（美元）；这一类任务用到的模型都不在价目表里时是 null。 */
  meanCostUsd: number | null;
  meanTokens: number;
}

export interface TaskMetrics {
  submitted: number;
  completed: number;
  failed: number;
  cancelled: number;
  /** 还没有到达终态（paused、running…）的任务。 */
  unfinished: number;
  /** 0..1；没有任务时是 null。 */
  successRate: number | null;
  /** 按任务类型（没有类型的记为 "task"），类型名按字典序。 */
  costByType: Record<string, TypeCost>;
  /** 毫秒；没有已结束的任务时是 null。 */
  p95LatencyMs: number | null;
  /** 参与 P95 的样本数（已结束的任务）。 */
  latencySamples: number;
  humanIntervened: number;
  /** 0..1；没有任务时是 null。 */
  humanInterventionRate: number | null;
}

export interface MetricsOptions {
  prices?: PriceTable;
  /** 这个任务是否需要过人。默认 needsHuman()。 */
  isHumanIntervention?(record: TaskRecord): boolean;
}

/** 参考线：成功率不低于 90 %，人工介入率不超过 3 %。 */
export const METRIC_THRESHOLDS = Object.freeze({ minSuccessRate: 0.9, maxHumanInterventionRate: 0.03 });

// ---------------------------------------------------------------------------
// Lab 23.4 · 计算
// ---------------------------------------------------------------------------

/** 最近秩法的分位数：排好序后取第 ⌈p·n⌉ 个（从 1 数）。空数组是 null。不改动输入。 */
export function percentile(values: readonly number[], p: number): number | null {
  if (!(p > 0 && p <= 1)) throw new RangeError(`分位数必须在 (0, 1] 之间，收到 ${p}`);
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.ceil(p * sorted.length) - 1]!;
}

/**
 * 默认的“需要人”判定：任务的事件里有一次 needs_human（第 22 章把工具逻辑错误交给人时迁到 paused 用的事件名），
 * 或者某条事件的 payload 带着 human: true。
 */
export function needsHuman(record: TaskRecord): boolean {
  return record.events.some((event) => {
    if (event.event === "needs_human") return true;
    const payload = event.payload;
    return payload !== null && typeof payload === "object" && !Array.isArray(payload) && payload.human === true;
  });
}

/** 从任务记录算出四个指标。 */
export function computeMetrics(records: readonly TaskRecord[], options: MetricsOptions = {}): TaskMetrics {
  const prices = options.prices ?? DEFAULT_PRICES;
  const human = options.isHumanIntervention ?? needsHuman;
  let completed = 0;
  let failed = 0;
  let cancelled = 0;
  let humanIntervened = 0;
  const latencies: number[] = [];
  const perType = new Map<string, { tasks: number; cost: number; priced: number; tokens: number }>();

  for (const record of records) {
    const state = record.snapshot.state;
    if (state === "completed") completed += 1;
    else if (state === "failed") failed += 1;
    else if (state === "cancelled") cancelled += 1;
    if (human(record)) humanIntervened += 1;

    const [root] = buildSpanTree(record, { prices });
    if (isTerminal(state) && root?.endedAt !== undefined) latencies.push(root.endedAt - root.startedAt);

    const type = record.snapshot.context.type ?? "task";
    const bucket = perType.get(type) ?? { tasks: 0, cost: 0, priced: 0, tokens: 0 };
    bucket.tasks += 1;
    bucket.tokens += (root?.tokens?.input ?? 0) + (root?.tokens?.output ?? 0);
    if (root?.costUsd !== undefined) {
      bucket.cost += root.costUsd;
      bucket.priced += 1;
    }
    perType.set(type, bucket);
  }

  const submitted = records.length;
  const costByType: Record<string, TypeCost> = {};
  for (const type of [...perType.keys()].sort()) {
    const bucket = perType.get(type)!;
    costByType[type] = {
      tasks: bucket.tasks,
      meanCostUsd: bucket.priced === 0 ? null : bucket.cost / bucket.tasks,
      meanTokens: bucket.tokens / bucket.tasks,
    };
  }
  return {
    submitted,
    completed,
    failed,
    cancelled,
    unfinished: submitted - completed - failed - cancelled,
    successRate: submitted === 0 ? null : completed / submitted,
    costByType,
    p95LatencyMs: percentile(latencies, 0.95),
    latencySamples: latencies.length,
    humanIntervened,
    humanInterventionRate: submitted === 0 ? null : humanIntervened / submitted,
  };
}

// ---------------------------------------------------------------------------
// Lab 23.4 · 表格
// ---------------------------------------------------------------------------

function percent(value: number | null): string {
  return value === null ? "—" : `${(value * 100).toFixed(1)} %`;
}

/** 显示宽度：中日韩字符与全角标点占两列。 */
function width(text: string): number {
  let columns = 0;
  for (const ch of text) columns += /[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]/.test(ch) ? 2 : 1;
  return columns;
}

function table(rows: readonly (readonly string[])[]): string {
  const widths = rows[0]!.map((_, column) => Math.max(...rows.map((row) => width(row[column]!))));
  return rows
    .map((row) => row.map((cell, column) => cell + " ".repeat(widths[column]! - width(cell))).join("  ").trimEnd())
    .join("\n");
}

/** 一张小表：指标、数值、参考线与是否越线。只有日志里的数字，输出稳定。 */
export function formatMetricsTable(metrics: TaskMetrics): string {
  const success = metrics.successRate;
  const humanRate = metrics.humanInterventionRate;
  const rows: string[][] = [
    ["指标", "数值", "参考线", "判断"],
    [
      "任务成功率",
      `${percent(success)}（${metrics.completed}/${metrics.submitted}）`,
      `≥ ${percent(METRIC_THRESHOLDS.minSuccessRate)}`,
      success === null ? "—" : success >= METRIC_THRESHOLDS.minSuccessRate ? "正常" : "越线",
    ],
  ];
  for (const [type, cost] of Object.entries(metrics.costByType)) {
    rows.push([
      `平均成本 · ${type}`,
      `${cost.meanCostUsd === null ? "—" : `$${cost.meanCostUsd.toFixed(6)}`}（${cost.meanTokens.toFixed(0)} tokens，${cost.tasks} 个）`,
      "看趋势",
      "—",
    ]);
  }
  rows.push(
    ["端到端时延 P95", metrics.p95LatencyMs === null ? "—" : `${metrics.p95LatencyMs} ms（${metrics.latencySamples} 个样本）`, "看趋势", "—"],
    [
      "人工介入率",
      `${percent(humanRate)}（${metrics.humanIntervened}/${metrics.submitted}）`,
      `≤ ${percent(METRIC_THRESHOLDS.maxHumanInterventionRate)}`,
      humanRate === null ? "—" : humanRate <= METRIC_THRESHOLDS.maxHumanInterventionRate ? "正常" : "越线",
    ],
  );
  return table(rows);
}
