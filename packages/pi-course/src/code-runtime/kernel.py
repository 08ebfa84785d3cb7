"""pi-course 第 20 章 · Python 内核程序（宿主是 python-kernel.ts）。

这个程序由宿主用 `python3 -u kernel.py '<能力清单 JSON>'` 启动，之后只通过一行一行的文本交谈：

宿主 → 内核（stdin）
  若干行代码 + 一行 __HARNESS_CELL_END__ <暗号>   一个单元格
  __HARNESS_STATE__ <暗号>                      控制行：报告 Runtime State，不进单元格流水线
  __HARNESS_CAP_REPLY__{json}                   对内核发出的能力调用的答复

内核 → 宿主（stdout）
  __HARNESS_READY__                             启动完成，可以发请求了
  __HARNESS_RESULT__<暗号> {json}               一个请求的结果（单元格和状态检查共用这一条通道）
  __HARNESS_CAP__<暗号> {json}                  单元格调用了宿主的能力，例如 fs.read("data.csv")

暗号是宿主给每个请求新生成的一串随机字符，内核只把它放在函数的局部变量和闭包里，从不放进 globals()、
argv 或环境变量。宿主只认带着当前请求暗号的结果行与能力行：单元格自己往 stdout 写一行
__HARNESS_RESULT__{…}、或者上一格留下的线程在后面乱写，都只是普通输出，决定不了结果。
（它挡的是“冒充”，不是蓄意的翻找：进程里的代码总能顺着栈帧找到局部变量——这个内核不是沙箱。）

单元格的输出有上限：超过 _OUTPUT_LIMIT 个字符的 stdout 与值只保留开头，并在末尾写明上限。

单元格在本模块的 globals() 里执行，变量因此跨单元格存活。为了让 describe 报告的只是单元格
亲手创建的东西，这里守着几条卫生规则：
  * 主循环、单元格执行、能力注入都写在函数里，循环变量是局部变量，不会留在 globals()；
  * 失败时才用到的 traceback 在函数里 import，它的名字也只是局部变量；
  * 内核自己的名字一律以下划线开头，状态探针跳过所有 _ 开头的名字，
    再跳过一个固定的内部集合：本模块 import 的几个模块，以及注入的能力命名空间。
"""

import ast
import io
import json
import sys
from _thread import get_ident as _get_ident

if sys.version_info[0] < 3:
    sys.stderr.write("kernel.py needs Python 3 (found Python " + sys.version.split()[0] + ")\n")
    sys.exit(3)

_CELL_END = "__HARNESS_CELL_END__"
_STATE = "__HARNESS_STATE__"
_RESULT = "__HARNESS_RESULT__"
_READY = "__HARNESS_READY__"
_CAP = "__HARNESS_CAP__"
_CAP_REPLY = "__HARNESS_CAP_REPLY__"
_PREVIEW_LIMIT = 80
# 一格交回的 stdout 与值（JSON 文本）各自最多这么多个字符；宿主那边的单行上限比它大得多。
_OUTPUT_LIMIT = 1_000_000

# 不属于用户的全局名字：本模块的 import；注入能力时再加入能力命名空间的名字。
_INTERNAL = {"ast", "io", "json", "sys"}

# 协议通道。单元格运行时 sys.stdout 被换成缓冲区，这两个引用始终指向真正的管道。
_wire_out = sys.stdout
_wire_in = sys.stdin


def _send(prefix, nonce=None, payload=None):
    if nonce is None:
        text = prefix
    else:
        # 先换一次行：单元格用 os.write 写了半行（甚至 50 MB 都没有换行）时，结果行也从行首开始，不会粘在后面。
        # 宿主知道这个约定，会去掉它因此多看到的那一个空行。
        text = "\n" + prefix + nonce + " " + json.dumps(payload, ensure_ascii=False)
    _wire_out.write(text + "\n")
    _wire_out.flush()


def _read_line():
    """读一行并去掉行尾（\\r\\n 与 \\n 一样对待）；宿主关闭管道时返回 None。"""
    line = _wire_in.readline()
    if line == "":
        return None
    return line.rstrip("\r\n")


class _HostError(Exception):
    """宿主的能力函数失败了；消息是宿主给出的原因。"""


def _make_host_caller():
    """当前请求的暗号与运行单元格的线程只活在这个闭包里。返回 (call_host, begin, end)。"""
    current = {"nonce": None, "thread": None}

    def begin(nonce):
        current["nonce"] = nonce
        current["thread"] = _get_ident()

    def end():
        current["nonce"] = None
        current["thread"] = None

    def call_host(namespace, function, args):
        # 只有正在运行的这一格自己能调用宿主：上一格留下的线程、两格之间的调用都被拒绝，
        # 否则它会和主循环抢着读 stdin。
        if current["nonce"] is None or current["thread"] != _get_ident():
            raise _HostError("能力 " + str(namespace) + "." + str(function) + " 只能在正在运行的单元格的主线程里调用")
        _send(_CAP, current["nonce"], {"ns": namespace, "fn": function, "args": list(args)})
        while True:
            line = _read_line()
            if line is None:
                sys.exit(0)
            if line.startswith(_CAP_REPLY):
                reply = json.loads(line[len(_CAP_REPLY):])
                if reply.get("ok"):
                    return reply.get("value")
                raise _HostError(reply.get("error", "宿主能力调用失败"))

    return call_host, begin, end


class _Namespace:
    """一个能力命名空间：每个属性都是一个转发给宿主的函数。"""

    def __init__(self, namespace, functions, call_host):
        self._namespace = namespace
        for function in functions:
            setattr(self, function, self._forwarder(function, call_host))

    def _forwarder(self, function, call_host):
        namespace = self._namespace

        def forward(*args):
            return call_host(namespace, function, args)

        forward.__name__ = function
        return forward

    def __repr__(self):
        return "<capability " + self._namespace + ">"


def _inject_capabilities(spec, call_host):
    """spec 形如 {"fs": ["read"]}：每个命名空间成为一个全局名字，并记入内部集合。
    _call_host 也放进 globals()（以 _ 开头，不进清单）：单元格可以绕过命名空间直接请求，宿主照样只认注入过的能力。"""
    namespace_globals = globals()
    namespace_globals["_call_host"] = call_host
    for namespace, functions in spec.items():
        namespace_globals[namespace] = _Namespace(namespace, functions, call_host)
        _INTERNAL.add(namespace)


def _preview(value):
    """repr 截到 80 个字符；repr 自己出错时退回 str，再不行用 object 的默认形式。"""
    try:
        text = repr(value)
    except BaseException:
        try:
            text = str(value)
        except BaseException:
            text = object.__repr__(value)
    if len(text) > _PREVIEW_LIMIT:
        text = text[: _PREVIEW_LIMIT - 3] + "..."
    return text


def _describe_state():
    variables = []
    for name, value in list(globals().items()):
        # globals() 也能被塞进不是字符串的键（globals()[1] = ...）：它不是变量名，跳过。
        if not isinstance(name, str) or name.startswith("_") or name in _INTERNAL:
            continue
        variables.append({"name": name, "type": type(value).__name__, "preview": _preview(value)})
    return {"alive": True, "variables": variables}


def _cut(text):
    """超过 _OUTPUT_LIMIT 个字符时只留开头，末尾写明上限。"""
    if len(text) <= _OUTPUT_LIMIT:
        return text
    return text[:_OUTPUT_LIMIT] + "\n…（超过 " + str(_OUTPUT_LIMIT) + " 个字符，其余已丢弃）\n"


def _plain(value):
    """单元格的值：能 JSON 化的原样交回，其余交回 repr；JSON 文本太长时交回截断的 repr。"""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        return _cut(_preview_text(value))
    if len(text) > _OUTPUT_LIMIT:
        return _cut(_preview_text(value))
    return value


def _preview_text(value):
    try:
        return repr(value)
    except BaseException:
        return object.__repr__(value)


def _run_cell(code):
    buffer = io.StringIO()
    saved = (sys.stdin, sys.stdout, sys.stderr)
    # print() 进缓冲区；input() 读到的是空输入，碰不到协议通道。
    sys.stdin = io.StringIO()
    sys.stdout = sys.stderr = buffer
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            # 像交互式解释器那样：最后一条是表达式时，它的值就是这一格的值。
            last = ast.Expression(tree.body.pop().value)
        namespace = globals()
        exec(compile(tree, "<cell>", "exec"), namespace)
        value = None if last is None else eval(compile(last, "<cell>", "eval"), namespace)
        result = {"ok": True, "stdout": _cut(buffer.getvalue())}
        if value is not None:
            result["value"] = _plain(value)
        return result
    except BaseException as error:  # SystemExit、KeyboardInterrupt 也只是这一格的失败
        import traceback

        frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename == "<cell>"]
        message = str(error)
        if isinstance(error, SyntaxError) and error.lineno is not None:
            message = error.msg + " (cell line " + str(error.lineno) + ")"
        elif frames:
            message = message + " (cell line " + str(frames[-1].lineno) + ")"
        return {"ok": False, "stdout": _cut(buffer.getvalue()), "error": {"name": type(error).__name__, "message": _cut(message)}}
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved


def _main():
    call_host, begin, end = _make_host_caller()
    _inject_capabilities(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}, call_host)
    _send(_READY)
    while True:
        line = _read_line()
        if line is None:
            return
        if line.startswith(_STATE + " "):
            # 控制行：不经过单元格流水线，直接在同一条结果通道上回一份状态。
            nonce = line[len(_STATE) + 1:]
            try:
                payload = {"ok": True, "value": _describe_state()}
            except BaseException as error:  # 观察出了意外：这一次看不清，内核照常活着
                payload = {"ok": False, "error": {"name": type(error).__name__, "message": str(error)}}
            _send(_RESULT, nonce, payload)
            continue
        if line.startswith(_CAP_REPLY):
            # 不在等能力答复时收到的答复行：不属于任何单元格，丢掉。
            continue
        lines = []
        while not line.startswith(_CELL_END + " "):
            lines.append(line)
            line = _read_line()
            if line is None:
                return
        nonce = line[len(_CELL_END) + 1:]
        begin(nonce)
        try:
            result = _run_cell("\n".join(lines))
        finally:
            end()
        _send(_RESULT, nonce, result)


if __name__ == "__main__":
    _main()
