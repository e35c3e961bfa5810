"""Configuration (kvt_config_*) and KV geometry (kvt_geometry_*)."""
import ctypes

from . import _lib
from ._arrays import uint
from ._handle import Handle
from .errors import check, invalid

lib = _lib.lib

LAYER_FIRST = 0  #: one buffer per layer per component (SGLang, vLLM)
PAGE_FIRST = 1   #: one buffer of pages, each holding every layer


def options():
    """The option table: a list of dicts with name, env, type, default and help."""
    out = []
    for i in range(lib.kvt_config_option_count()):
        info = _lib.OptionInfo()
        check(lib.kvt_config_option(i, ctypes.byref(info)))
        out.append({k: _lib.cstr(getattr(info, k)) for k in
                    ("name", "env", "type", "default_value", "help")})
    return out


class Config(Handle):
    """A kvt_config: every option at its default, then ``options`` applied
    (a dict name -> value; values are str, int, float or bool).

    >>> with Config({"cpu_capacity": "64MiB", "block_tokens": 16}) as cfg:
    ...     cfg["cpu_capacity"]
    '64MiB'
    """

    _destroy = lib.kvt_config_destroy

    def __init__(self, options=None, env=False):
        super().__init__()
        check(self._create(lib.kvt_config_create))
        if env:
            self.load_env()
        for k, v in (options or {}).items():
            self.set(k, v)

    def set(self, name, value):
        """Sets option `name` from its string form (validated now)."""
        if not isinstance(name, str):
            raise invalid("config option name: expected str, got %s" % type(name).__name__)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, (str, int, float)):
            raise invalid("config option %s: expected str, int, float or bool, got %s"
                          % (name, type(value).__name__))
        check(self._call(lib.kvt_config_set, name.encode(), str(value).encode()))
        return self

    def get(self, name):
        """The option's current value as a string."""
        if not isinstance(name, str):
            raise invalid("config option name: expected str, got %s" % type(name).__name__)
        buf = ctypes.create_string_buffer(4096)
        check(self._call(lib.kvt_config_get, name.encode(), buf, len(buf)))
        return buf.value.decode()

    __getitem__ = get
    __setitem__ = set

    def load_json(self, text):
        """Applies a JSON object {"name": value}; all-or-nothing."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        check(self._call(lib.kvt_config_load_json, data, len(data)))
        return self

    def load_file(self, path):
        """Applies the JSON object in file `path`."""
        check(self._call(lib.kvt_config_load_file, str(path).encode()))
        return self

    def load_env(self):
        """Applies every KVTIER_* environment variable (unknown ones are errors)."""
        check(self._call(lib.kvt_config_load_env))
        return self

    def digest(self):
        """A digest of every option's value (the rank-group handshake compares it)."""
        out = ctypes.c_uint64()
        check(self._call(lib.kvt_config_digest, ctypes.byref(out)))
        return out.value


def _layer_spec(components):
    """A LayerSpec from [(kv_heads, head_dim, elem_size), ...] (1 or 2 entries)."""
    comps = list(components)
    if len(comps) not in (1, 2):
        raise invalid("layer spec: %d components; 2 (K, V) or 1 (MLA)" % len(comps))
    spec = _lib.LayerSpec()
    spec.num_components = len(comps)
    for i, c in enumerate(comps):
        if len(tuple(c)) != 3:
            raise invalid("layer spec component %d: expected (kv_heads, head_dim, elem_size)" % i)
        h, d, e = (uint(x, "layer spec component %d" % i) for x in c)
        spec.component[i] = _lib.ComponentSpec(h, d, e)
    return spec


class Geometry(Handle):
    """A KV geometry: layers, tokens per engine page, layout, and per layer
    its components (K and V, or one for MLA): KV heads, head dim, bytes per
    element.

    >>> g = Geometry(num_layers=4, tokens_per_page=16)
    >>> g.set_layers(0, 4, [(2, 64, 2), (2, 64, 2)])   # K and V, bf16
    """

    _destroy = lib.kvt_geometry_destroy

    def __init__(self, num_layers=None, tokens_per_page=None, layout=LAYER_FIRST, _handle=None):
        super().__init__()
        if _handle is not None:
            self._adopt(_handle)
            return
        if layout not in (LAYER_FIRST, PAGE_FIRST):
            raise invalid("layout: expected kvtier.LAYER_FIRST or kvtier.PAGE_FIRST, got %r" % (layout,))
        check(self._create(lib.kvt_geometry_create, uint(num_layers, "num_layers"),
                           uint(tokens_per_page, "tokens_per_page"), layout))

    @classmethod
    def preset(cls, name, tokens_per_page, tp=1):
        """A known model ("llama3-8b", "llama3-70b", "deepseek-v3", "tiny") at TP size tp."""
        h = ctypes.c_void_p()
        if not isinstance(name, str):
            raise invalid("preset name: expected str")
        check(lib.kvt_geometry_preset(ctypes.byref(h), name.encode(),
                                      uint(tokens_per_page, "tokens_per_page"), uint(tp, "tp")))
        return cls(_handle=h)

    @classmethod
    def uniform(cls, num_layers, tokens_per_page, kv_heads, head_dim, elem_size=2,
                components=2, layout=LAYER_FIRST):
        """Every layer alike: `components` (2: K and V; 1: MLA) of kv_heads x head_dim."""
        g = cls(num_layers, tokens_per_page, layout)
        try:
            g.set_layers(0, num_layers, [(kv_heads, head_dim, elem_size)] * components)
            g.validate()
        except BaseException:
            g.close()
            raise
        return g

    def set_layer(self, layer, components):
        """Describes one layer: components = [(kv_heads, head_dim, elem_size), ...]."""
        spec = _layer_spec(components)
        check(self._call(lib.kvt_geometry_set_layer, uint(layer, "layer"), ctypes.byref(spec)))
        return self

    def set_layers(self, first, count, components):
        """Describes layers [first, first + count) identically."""
        spec = _layer_spec(components)
        check(self._call(lib.kvt_geometry_set_layers, uint(first, "first"),
                         uint(count, "count"), ctypes.byref(spec)))
        return self

    def validate(self):
        """Raises InvalidArgument naming the layer and field unless complete and sane."""
        check(self._call(lib.kvt_geometry_validate))
        return self

    def info(self):
        """A dict: num_layers, tokens_per_page, layout, bytes_per_token, bytes_per_page, digest."""
        gi = _lib.GeometryInfo()
        check(self._call(lib.kvt_geometry_info_get, ctypes.byref(gi)))
        return {k: getattr(gi, k) for k, _ in _lib.GeometryInfo._fields_}

    def token_bytes(self, layer, component):
        """Bytes one token takes in one layer's component."""
        out = ctypes.c_uint64()
        check(self._call(lib.kvt_geometry_token_bytes, uint(layer, "layer"),
                         uint(component, "component"), ctypes.byref(out)))
        return out.value

    def num_components(self, layer):
        """1 or 2: how many components layer `layer` has."""
        return 2 if self._has_component(layer, 1) else 1

    def _has_component(self, layer, component):
        out = ctypes.c_uint64()
        return self._call(lib.kvt_geometry_token_bytes, layer, component, ctypes.byref(out)) == 0

    def compare(self, other):
        """Raises GeometryMismatch naming the first field that differs."""
        check(self._call(lib.kvt_geometry_compare, other))

    def clone(self):
        """A deep copy."""
        h = ctypes.c_void_p()
        check(self._call(lib.kvt_geometry_clone, ctypes.byref(h)))
        return Geometry(_handle=h)
