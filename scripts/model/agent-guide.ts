// AGENT_GUIDE.md of a practice folder: how to let a coding agent coach you through this chapter without it doing the
// chapter for you, plus the chapter's facts (start, goal with lab counts, first red, acceptance) taken from the manifest
// and the guide. LEARN_WITH_AGENT.md at the course root is the longer version of the same rules.
import { type Checkpoint, chapterNumber, totalTests } from "./manifest.js";

/** The `## 验收清单` section of a guide, up to the next `## ` heading (empty when the guide has none). */
export function acceptanceSection(guide: string): string {
  const start = guide.indexOf("\n## 验收清单");
  if (start < 0) return "";
  const rest = guide.slice(start + 1);
  const end = rest.indexOf("\n## ", 3);
  return (end < 0 ? rest : rest.slice(0, end)).trim();
}

export function agentGuideText(c: Checkpoint, guide: string): string {
  const n = chapterNumber(c);
  const acceptance = acceptanceSection(guide).replace(/^## 验收清单\s*/, "");
  return [
    `# 和编码 Agent 一起学第 ${c.id} 章 · ${c.title}`,
    "",
    "把这份文件交给你的编码 Agent（Claude Code、Codex、Cursor……都可以），告诉它：“你是陪练，不是替我写作业的人。”",
    "下面的规则写给 Agent，也写给你：哪一条被打破了，就停下来，把话说回到规则上。",
    "",
    "## 陪练规则",
    "",
    "1. **先预测，后运行。** 每次运行测试之前，先由学习者说出预期：哪几项会红、第一条失败会是什么。Agent 只在预测说完后才运行。",
    "2. **先读 parent，再看差异。** 这个目录就是 parent 加上脚手架。先读懂 parent 里已有的代码和本章的聚焦测试；",
    "   整章变绿以后，才去课程仓库看 target 的 diff（`npm run checkpoint -w @pi/course -- " + c.id + " --diff`）做对照。",
    "3. **一步只守一条不变量。** 每一步只改最少的代码，并说出这一步让哪一条不变量成立；改完只跑对应的 lab。",
    `4. **卡住就爬提示阶梯。** 先让学习者运行 \`npm run hint -w @pi/course -- ${n}.1\`（把 ${n}.1 换成当前的 lab）：第一级看哪里，第二级签名与不变量，第三级伪代码。`,
    "   Agent 的提示也按这三级给，每次只上一级。",
    "5. **从不粘贴答案。** Agent 不写出本章教学文件的完整实现，不从课程仓库、上游或别处复制代码；学习者自己敲每一行。",
    "6. **从不削弱测试。** 不改、不跳过、不删测试，不关 strict，不往测试里塞 `skip`/`todo`；测试文件被改过时 `lab` 会警告。",
    "7. **找第一处偏差。** 红灯时先读第一条失败，问“预期与实际第一次分开在哪里”，再决定改哪一行。",
    "",
    "## 本章",
    "",
    `- **起点**：第 ${c.id === "00" ? "00 章（观察模式，目录里就是 target）" : `${String(Number(c.id) - 1).padStart(2, "0")} 章的终点（parent），教学文件换成了脚手架`}`,
    `- **目标**：${c.labs.map((l) => `Lab ${l.id} ${l.count} 项`).join("，")}，共 ${totalTests(c)} 项全部通过（\`npm run lab -w @pi/course -- ${n}\` 最后一行是 \`chapter total: ${totalTests(c)}/${totalTests(c)}\`）`,
    `- **第一次红灯**：${c.firstRed ? `\`${c.firstRed}\`` : "观察模式没有红灯：先预测，再运行验证"}`,
    `- **第一步**：${c.firstStep}`,
    "- **讲义**：`GUIDE.md`（每个 lab 的目标、文件、动作、运行、预期都在那里）",
    "",
    "## 验收",
    "",
    acceptance || "见 GUIDE.md 的验收清单。",
    "",
  ].join("\n");
}
