// Search tokens for Chinese and English alike, used both when the index is built (Node) and when the learner types
// a query (browser). Words split on spaces and punctuation as usual; a run of CJK characters has no spaces, so it
// becomes its overlapping pairs (「幂等键」 → 幂等 · 等键) plus, for a lone character, the character itself. With the
// search combining terms with AND, a query finds the pages that contain every pair of it.
const CJK = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]/u;
const SEPARATORS = /[\s\p{Z}\p{P}\p{S}]+/u;

export function tokenize(text: string): string[] {
  const tokens: string[] = [];
  for (const word of text.split(SEPARATORS)) {
    if (!word) continue;
    let latin = "";
    let han: string[] = [];
    const flushLatin = () => { if (latin) tokens.push(latin); latin = ""; };
    const flushHan = () => {
      if (han.length === 1) tokens.push(han[0]!);
      for (let i = 0; i + 1 < han.length; i++) tokens.push(han[i]! + han[i + 1]!);
      han = [];
    };
    for (const ch of word) {
      if (CJK.test(ch)) { flushLatin(); han.push(ch); } else { flushHan(); latin += ch; }
    }
    flushLatin();
    flushHan();
  }
  return tokens;
}
