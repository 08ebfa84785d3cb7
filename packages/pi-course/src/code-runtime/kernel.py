"""pi-course 第 20 章 · Python 内核程序（宿主是 python-kernel.ts）。

这个程序由宿主用 `python3 -u kernel.py '<能力清单 JSON>'` 启动，之后只通过一行一行的文本交谈：

宿主 → 内核（stdin）
  若干行代码 + 一行 __HARNESS_CELL_END__        一个单元格
  __HARNESS_STATE__                             控制行：报告 Runtime State，不进单元格流水线
  __HARNESS_CAP_REPLY__{json}                   对内核发出的能力调用的答复

内核 → 宿主（stdout）
  __HARNESS_READY__                             启动完成，可以发请求了
  __HARNESS_RESULT__{json}                      一个请求的结果（单元格和状态检查共用这一条通道）
  __HARNESS_CAP__{json}                         单元格调用了宿主的能力，例如 fs.read("data.csv")

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

# 不属于用户的全局名字：本模块的 import；注入能力时再加入能力命名空间的名字。
_INTERNAL = {"ast", "io", "json", "sys"}

# 协议通道。单元格运行时 sys.stdout 被换成缓冲区，这两个引用始终指向真正的管道。
_wire_out = sys.stdout
_wire_in = sys.stdin


def _send(prefix, payload=None):
    text = prefix if payload is None else prefix + json.dumps(payload, ensure_ascii=False)
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


def _call_host(namespace, function, args):
    _send(_CAP, {"ns": namespace, "fn": function, "args": list(args)})
    while True:
        line = _read_line()
        if line is None:
            sys.exit(0)
        if line.startswith(_CAP_REPLY):
            reply = json.loads(line[len(_CAP_REPLY):])
            if reply.get("ok"):
                return reply.get("value")
            raise _HostError(reply.get("error", "宿主能力调用失败"))


class _Namespace:
    """一个能力命名空间：每个属性都是一个转发给宿主的函数。"""

    def __init__(self, namespace, functions):
        self._namespace = namespace
        for function in functions:
            setattr(self, function, self._forwarder(function))

    def _forwarder(self, function):
        namespace = self._namespace

        def forward(*args):
            return _call_host(namespace, function, args)

        forward.__name__ = function
        return forward

    def __repr__(self):
        return "<capability " + self._namespace + ">"


def _inject_capabilities(spec):
    """spec 形如 {"fs": ["read"]}：每个命名空间成为一个全局名字，并记入内部集合。"""
    namespace_globals = globals()
    for namespace, functions in spec.items():
        namespace_globals[namespace] = _Namespace(namespace, functions)
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
        if name.startswith("_") or name in _INTERNAL:
            continue
        variables.append({"name": name, "type": type(value).__name__, "preview": _preview(value)})
    return {"alive": True, "variables": variables}


def _plain(value):
    """单元格的值：能 JSON 化的原样交回，其余交回 repr。"""
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError, RecursionError):
        return repr(value)


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
        result = {"ok": True, "stdout": buffer.getvalue()}
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
        return {"ok": False, "stdout": buffer.getvalue(), "error": {"name": type(error).__name__, "message": message}}
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved


def _main():
    _inject_capabilities(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    _send(_READY)
    while True:
        line = _read_line()
        if line is None:
            return
        if line == _STATE:
            # 控制行：不经过单元格流水线，直接在同一条结果通道上回一份状态。
            _send(_RESULT, {"ok": True, "value": _describe_state()})
            continue
        lines = []
        while line != _CELL_END:
            lines.append(line)
            line = _read_line()
            if line is None:
                return
        _send(_RESULT, _run_cell("\n".join(lines)))


if __name__ == "__main__":
    _main()
