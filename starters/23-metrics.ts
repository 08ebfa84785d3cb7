// 第 23 章脚手架 · 四个指标（Lab 23.4）。
//
// 运维看板上只放四个指标，全部从任务日志（第 21 章的存储）算出来，不另设计数器：
//   任务成功率          completed 数 ÷ 提交数（还没结束的任务也在分母里）
//   单任务平均成本      按任务类型分组：每个任务执行树上的估算费用与 token 之和，再取平均
//   端到端时延 P95      created 事件到终态事件的时长，最近秩法（排好序后第 ⌈0.95·n⌉ 个）
//   人工介入率          至少有一次 needs_human 的任务 ÷ 提交数
// 参考线：成功率低于 90 % 说明系统有问题，人工介入率超过 3 % 说明自愈与重试还不够。
//
// 类型、参考线与表格（formatMetricsTable）已经给出；percentile、needsHuman、computeMetrics 抛出 `Lab 23.4 … 尚未实现`。

import { DEFAULT_PRICES, type PriceTable, type TaskRecord } from "./spans.js";

// ---------------------------------------------------------------------------
// 公开类型（已给出）
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

function labError(name: string): Error {
  return new Error(`Lab 23.4 ${name} 尚未实现`);
}

/** 最近秩法的分位数：排好序后取第 ⌈p·n⌉ 个（从 1 数）。空数组是 null。不改动输入。 */
export function percentile(values: readonly number[], p: number): number | null {
  void values;
  void p;
  throw labError("percentile");
}

/**
 * 默认的“需要人”判定：任务的事件里有一次 needs_human（第 22 章把工具逻辑错误交给人时迁到 paused 用的事件名），
 * 或者某条事件的 payload 带着 human: true。
 */
export function needsHuman(record: TaskRecord): boolean {
  void record;
  throw labError("needsHuman");
}

/** 从任务记录算出四个指标。 */
export function computeMetrics(records: readonly TaskRecord[], options: MetricsOptions = {}): TaskMetrics {
  void records;
  void options;
  void DEFAULT_PRICES;
  throw labError("computeMetrics");
}

// ---------------------------------------------------------------------------
// 表格（已给出）
// ---------------------------------------------------------------------------

// >>> 已给出：一张稳定的小表
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
// <<< 已给出
