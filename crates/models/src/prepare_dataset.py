# The dataset preparation `tenet models fetch` runs (see PREPARE_PY in fetch.rs): standard
# library only, the pickle walked by pickletools and never unpickled.
import gzip, json, os, pickletools, sys


class Capped:
    """A decompressed stream refused past `limit` bytes (a gzip bomb stops here)."""

    def __init__(self, f, limit):
        self.f, self.n, self.limit = f, 0, limit

    def _count(self, b):
        self.n += len(b)
        if self.n > self.limit:
            fail("decompresses to more than %d bytes" % self.limit)
        return b

    def read(self, n=-1):
        room = self.limit + 1 - self.n
        return self._count(self.f.read(room if n is None or n < 0 else min(n, room)))

    def readline(self):
        return self._count(self.f.readline(self.limit + 1 - self.n))

    def tell(self):
        return self.n


def fail(msg):
    sys.stderr.write("%s: %s\n" % (SRC, msg))
    sys.exit(1)


def digits(src, out):
    with gzip.open(src, "rb") as f:
        data = Capped(f, 16 << 20).read()
    with open(os.path.join(out, "digits.csv"), "wb") as f:
        f.write(data)


class Global:
    def __init__(self, module, name):
        self.module, self.name = module, name


class Call:
    def __init__(self, fn, args):
        self.fn, self.args, self.state = fn, args, None


MARK = object()
RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}
GLOBALS = RECONSTRUCT | {("numpy", "ndarray"), ("numpy", "dtype")}
DTYPES = {"f4": ("float32", 4), "i8": ("int64", 8)}
SPLITS = ("train", "valid", "test")


def walk(src):
    """The pickle's value as plain tuples, Globals and Calls, read with genops alone: no import,
    no call, nothing but these opcodes."""
    stack, memo = [], {}
    with gzip.open(src, "rb") as f:
        for op, arg, pos in pickletools.genops(Capped(f, 512 << 20)):
            name = op.name
            if name in ("PROTO", "FRAME"):
                pass
            elif name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                if not stack or stack[-1] is MARK:
                    fail("%s of nothing at %d" % (name, pos))
                memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                if arg not in memo:
                    fail("%s of unknown memo %r at %d" % (name, arg, pos))
                stack.append(memo[arg])
            elif name == "MARK":
                stack.append(MARK)
            elif name in ("BININT", "BININT1", "BININT2"):
                stack.append(arg)
            elif name == "NONE":
                stack.append(None)
            elif name in ("NEWTRUE", "NEWFALSE"):
                stack.append(name == "NEWTRUE")
            elif name in ("SHORT_BINSTRING", "BINSTRING", "SHORT_BINUNICODE", "BINUNICODE"):
                stack.append(arg)  # genops gives protocol 2's byte strings as latin-1 text
            elif name in ("SHORT_BINBYTES", "BINBYTES", "BINBYTES8"):
                stack.append(bytes(arg))
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                k = int(name[-1])
                if len(stack) < k or any(x is MARK for x in stack[-k:]):
                    fail("%s without %d items at %d" % (name, k, pos))
                items = tuple(stack[-k:])
                del stack[-k:]
                stack.append(items)
            elif name == "TUPLE":
                if MARK not in stack:
                    fail("TUPLE without MARK at %d" % pos)
                i = len(stack) - 1 - stack[::-1].index(MARK)
                items = tuple(stack[i + 1:])
                del stack[i:]
                stack.append(items)
            elif name == "GLOBAL":
                module, _, attr = arg.partition(" ")
                if (module, attr) not in GLOBALS:
                    fail("refusing GLOBAL %s.%s at %d" % (module, attr, pos))
                stack.append(Global(module, attr))
            elif name == "REDUCE":
                if len(stack) < 2 or not isinstance(stack[-2], Global) or not isinstance(stack[-1], tuple):
                    fail("REDUCE without a global and arguments at %d" % pos)
                args = stack.pop()
                stack.append(Call(stack.pop(), args))
            elif name == "BUILD":
                if len(stack) < 2 or not isinstance(stack[-2], Call) or stack[-2].state is not None:
                    fail("BUILD without a fresh object at %d" % pos)
                if stack[-1] is MARK:
                    fail("BUILD of a MARK at %d" % pos)
                state = stack.pop()
                stack[-1].state = state
            elif name == "STOP":
                if len(stack) != 1:
                    fail("STOP with %d items on the stack" % len(stack))
                return stack[0]
            else:
                fail("unexpected opcode %s at %d" % (name, pos))
            if len(stack) > 64 or len(memo) > 64:
                fail("more nesting than an MNIST pickle has, at %d" % pos)
    fail("no STOP")


def is_global(x, names):
    return isinstance(x, Global) and (x.module, x.name) in names


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def as_bytes(x):
    if isinstance(x, str):
        return x.encode("latin-1")
    return x


def array(x, what):
    """A numpy array's dtype, shape and little-endian bytes, from `_reconstruct(ndarray, (0,),
    b'b')` and its BUILD state `(1, shape, dtype, fortran=False, data)`."""
    if not (isinstance(x, Call) and is_global(x.fn, RECONSTRUCT) and len(x.args) == 3
            and is_global(x.args[0], {("numpy", "ndarray")}) and x.args[1] == (0,)
            and as_bytes(x.args[2]) == b"b"):
        fail("%s is not a numpy array reconstruction" % what)
    s = x.state
    if not (isinstance(s, tuple) and len(s) == 5 and is_int(s[0]) and s[0] == 1):
        fail("%s: array state is not (1, shape, dtype, fortran, data)" % what)
    _, shape, dt, fortran, data = s
    if not (isinstance(shape, tuple) and all(is_int(d) and 0 <= d < (1 << 31) for d in shape)):
        fail("%s: bad shape %r" % (what, shape))
    if fortran not in (False, 0):
        fail("%s: Fortran order" % what)
    if not (isinstance(dt, Call) and is_global(dt.fn, {("numpy", "dtype")}) and len(dt.args) == 3
            and dt.args[0] in DTYPES and dt.args[1] in (0, False) and dt.args[2] in (1, True)):
        fail("%s: dtype is not f4 or i8" % what)
    ds = dt.state
    if not (isinstance(ds, tuple) and len(ds) == 8 and ds[0] == 3 and ds[1] == "<"
            and ds[2:5] == (None, None, None) and ds[5:] == (-1, -1, 0)):
        fail("%s: dtype state %r is not plain little-endian" % (what, ds))
    if not isinstance(data, (str, bytes)):
        fail("%s: data is not a byte string" % what)
    data = as_bytes(data)
    dtype, size = DTYPES[dt.args[0]]
    n = size
    for d in shape:
        n *= d
    if len(data) != n:
        fail("%s: %d data bytes for shape %r of %s (%d expected)" % (what, len(data), shape, dtype, n))
    return dtype, list(shape), data


def mnist(src, out):
    top = walk(src)
    if not (isinstance(top, tuple) and len(top) == 3
            and all(isinstance(p, tuple) and len(p) == 2 for p in top)):
        fail("not a (train, valid, test) triple of (images, labels) pairs")
    files = []
    for split, (images, labels) in zip(SPLITS, top):
        xt, xs, xb = array(images, split + " images")
        yt, ys, yb = array(labels, split + " labels")
        if xt != "float32" or len(xs) != 2 or xs[1] != 784:
            fail("%s images: %s %r, not float32 [n, 784]" % (split, xt, xs))
        if yt != "int64" or ys != xs[:1]:
            fail("%s labels: %s %r, not int64 [%d]" % (split, yt, ys, xs[0]))
        files.append((split + "-images", "f32", xt, xs, xb))
        files.append((split + "-labels", "i64", yt, ys, yb))
    # Everything checked: only now write (the bytes as they were: numpy's '<', little-endian).
    arrays = []
    for name, ext, dtype, shape, data in files:
        with open(os.path.join(out, name + "." + ext), "wb") as f:
            f.write(data)
        arrays.append({"name": name, "file": name + "." + ext, "dtype": dtype, "shape": shape})
    header = {"format": "tenet-mnist-raw-1", "source": "mnist/data/mnist.pkl.gz",
              "byte_order": "little", "arrays": arrays}
    with open(os.path.join(out, "mnist.json"), "w") as f:
        json.dump(header, f, indent=1)
        f.write("\n")


MODE, SRC, OUT = sys.argv[1:4]
try:
    {"digits": digits, "mnist": mnist}[MODE](SRC, OUT)
except Exception as e:  # genops' own complaints (truncation, bad opcodes), I/O
    fail("%s: %s" % (type(e).__name__, e))
