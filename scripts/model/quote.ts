// Paths the harness prints for the learner to paste: one form that bash, zsh and PowerShell all read the same way.
/**
 * Plain when nothing in the path is special; else single quotes (literal in bash and in PowerShell); a path that
 * holds a single quote gets double quotes, which both shells read literally as long as it has no `$`, backtick,
 * `"`, `\` or `!`. A path with both kinds is returned in single quotes with bash's `'\''` escape (bash first).
 */
export function quotePath(p: string): string {
  if (/^[A-Za-z0-9_\-./:@%+=,]+$/.test(p)) return p;
  if (!p.includes("'")) return `'${p}'`;
  if (!/[$`"\\!]/.test(p)) return `"${p}"`;
  return `'${p.replace(/'/g, "'\\''")}'`;
}
