// 第 05 章与第 23 章共用的一份“会泄漏的文本”清单：provider 的错误文本（第 05 章）和执行树的摘要（第 23 章）
// 经过的是同一个 redactSecrets，所以用同一份清单检查。每一条是一段真实场景里会出现的文本，
// secrets 是其中绝不能留下来的片段，kept 是脱敏之后仍应看得见的上下文（免得把整段都遮掉也算“通过”）。
// 这里的值都是编出来的，只是形状像真的。

export interface SecretSample {
  /** 这一条考的是什么（中文，出现在断言消息里）。 */
  what: string;
  text: string;
  secrets: readonly string[];
  kept: readonly string[];
}

const base64url = (value: string): string => Buffer.from(value, "utf8").toString("base64url");
const JWT = `${base64url('{"alg":"HS256","typ":"JWT"}')}.${base64url('{"sub":"lab-05","role":"学员"}')}.Qm9ndXMtc2lnbmF0dXJlLWZvci1jb3Vyc2U`;

export const SECRET_SAMPLES: readonly SecretSample[] = [
  {
    what: "JSON 里带空格的口令",
    text: '{"user": "li", "password": "correct horse battery staple"}',
    secrets: ["correct", "horse", "battery", "staple"],
    kept: ['"user": "li"', '"password": "'],
  },
  {
    what: "Basic 认证头",
    text: `Authorization: Basic ${Buffer.from("li:hunter2-course").toString("base64")}`,
    secrets: [Buffer.from("li:hunter2-course").toString("base64")],
    kept: ["Authorization: Basic "],
  },
  {
    what: "URL 里的 user:pass@",
    text: "连接失败：postgres://course_admin:Pa55-w0rd-05@db.internal:5432/app",
    secrets: ["Pa55-w0rd-05"],
    kept: ["postgres://course_admin:", "@db.internal:5432/app"],
  },
  {
    what: "JWT",
    text: `会话令牌 ${JWT} 已过期`,
    secrets: JWT.split("."),
    kept: ["会话令牌 ", " 已过期"],
  },
  {
    what: "常见 provider 的密钥前缀",
    text: [
      "keys: sk-proj-Zx81aa0Kq2LmNv7Tt9Yc3Rb0",
      "sk-ant-api03-QwErTy1234567890uIoP",
      "AIzaSyCourse05abcdefghijklmnopqrstu",
      "hf_CourseFakeTokenAbcdefghijklmnopqr",
      `ghp_${"C0urse".repeat(4)}`,
      `github_pat_11AB${"cd12".repeat(6)}`,
      "glpat-Course05FakeToken1234",
      "xoxb-1234567890-course",
      "AKIACOURSE05EXAMPLE1",
      `gsk_${"fake".repeat(6)}`,
    ].join(" "),
    secrets: [
      "Zx81aa0Kq2LmNv7Tt9Yc3Rb0",
      "QwErTy1234567890uIoP",
      "Course05abcdefghijklmnopqrstu",
      "CourseFakeTokenAbcdefghijklmnopqr",
      "C0urseC0urse",
      "cd12cd12cd12",
      "Course05FakeToken1234",
      "1234567890-course",
      "COURSE05EXAMPLE1",
      "fakefakefake",
    ],
    kept: ["keys: "],
  },
  {
    what: "PEM 私钥块",
    text: "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\nQ291cnNlMDVGYWtlS2V5Qm9keQ==\n-----END OPENSSH PRIVATE KEY-----",
    secrets: ["b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ", "Q291cnNlMDVGYWtlS2V5Qm9keQ=="],
    kept: ["-----BEGIN OPENSSH PRIVATE KEY-----", "-----END OPENSSH PRIVATE KEY-----"],
  },
  {
    what: "URL 编码的 token%3D…",
    text: "redirect=https%3A%2F%2Fapp.test%2Fcb%3Ftoken%3Dq8Zr2LmN0pX4%26page%3D2",
    secrets: ["q8Zr2LmN0pX4"],
    kept: ["redirect=https%3A%2F%2Fapp.test%2Fcb%3Ftoken%3D", "%26page%3D2"],
  },
  {
    what: "全角冒号 secret：",
    text: "配置里写着 client_secret：机密口令甲乙丙，请勿外传",
    secrets: ["机密口令甲乙丙"],
    kept: ["配置里写着 client_secret：", "，请勿外传"],
  },
  {
    what: "分隔符之后隔着空格的值",
    text: "db_password:    hunter2-after-spaces next",
    secrets: ["hunter2-after-spaces"],
    kept: ["db_password:", " next"],
  },
  {
    what: "分隔符之后换了行的值",
    text: "api_key =\n    9f8e7d6c5b4a3928\nretry later",
    secrets: ["9f8e7d6c5b4a3928"],
    kept: ["api_key =", "retry later"],
  },
];
