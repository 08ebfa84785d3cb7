// verify's text checks on starters, as pure functions: a stale copy of the parent and a leaked implementation.
import test from "node:test";
import assert from "node:assert/strict";
import { leakedLines, staleStarterLines } from "../scripts/model/verify.js";

const parent = [
  "export function load(path: string): string {",
  "  const text = readFileSync(path, \"utf8\");",
  "  return text;",
  "}",
].join("\n");
const target = `${parent}\nexport function save(path: string, text: string): void {\n  writeFileSync(path, normalise(text), \"utf8\");\n}\n`;

test("脚手架过期检查：parent 与 target 共有的一行在脚手架里丢了，就被指出；原样保留则没有发现", () => {
  const fresh = `${parent}\nexport function save(path: string, text: string): void {\n  throw labError(\"Lab 4.1 save\");\n}\n`;
  assert.deepEqual(staleStarterLines(parent, target, fresh), []);
  // An earlier chapter was edited later: the parent (and so the target) now read differently from the old copy.
  const editedParent = parent.replace("const text = readFileSync(path, \"utf8\");", "const text = readFileSync(path, \"utf8\").trimEnd();");
  const editedTarget = target.replace("const text = readFileSync(path, \"utf8\");", "const text = readFileSync(path, \"utf8\").trimEnd();");
  assert.deepEqual(staleStarterLines(editedParent, editedTarget, fresh), ["const text = readFileSync(path, \"utf8\").trimEnd();"]);
});

test("泄漏检查：只统计本章新增的实现行，声明与签名不算；脚手架带上实现行就被计数", () => {
  const stub = "export function save(path: string, text: string): void {\n  throw labError(\"Lab 4.1 save\");\n}\n";
  assert.deepEqual(leakedLines(parent, target, stub), { leaked: [], total: 1 });
  const leaky = "export function save(path: string, text: string): void {\n  writeFileSync(path, normalise(text), \"utf8\");\n}\n";
  assert.deepEqual(leakedLines(parent, target, leaky), { leaked: ["writeFileSync(path, normalise(text), \"utf8\");"], total: 1 });
});

test("泄漏检查：包在“已给出”围栏里的实现行是有意交给学习者的，不算泄漏；围栏外的照样计数", () => {
  const fenced = [
    "// >>> 已给出：契约交给学习者的辅助函数",
    "export function save(path: string, text: string): void {",
    "  writeFileSync(path, normalise(text), \"utf8\");",
    "}",
    "// <<< 已给出",
  ].join("\n");
  assert.deepEqual(leakedLines(parent, target, fenced), { leaked: [], total: 1 });
  const outside = fenced.replace("// <<< 已给出", "// <<< 已给出\nwriteFileSync(path, normalise(text), \"utf8\");");
  assert.deepEqual(leakedLines(parent, target, outside), { leaked: ["writeFileSync(path, normalise(text), \"utf8\");"], total: 1 });
});
