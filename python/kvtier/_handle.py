"""The base of every wrapper that owns a C handle: close() is idempotent,
a closed handle raises StateError instead of reaching the library, and
every handle is a context manager."""
import ctypes
import weakref

from .errors import STATUS, StateError


class Handle:
    """Owns one opaque C handle; ``with`` closes it."""

    _destroy = None  # the library's destroy function, set by subclasses

    def __init__(self):
        self._h = ctypes.c_void_p()
        self._keep = []  # objects the C side points into
        self._dependents = weakref.WeakSet()  # handles that borrow this one

    def _borrow(self, *owners):
        """Records that this handle borrows `owners`: they stay alive while it
        does, and closing one of them closes this handle first."""
        for o in owners:
            self._keep.append(o)
            o._dependents.add(self)

    @property
    def handle(self):
        """The raw C pointer (a ctypes.c_void_p); raises once closed."""
        if not self._h:
            raise StateError(STATUS["ESTATE"], "%s is closed" % type(self).__name__)
        return self._h

    @property
    def closed(self):
        """True once close() ran (or creation failed)."""
        return not self._h

    def _before_close(self):
        """Hook for subclasses: runs before the handle is destroyed."""

    def close(self):
        """Destroys the C object. Idempotent."""
        if self._h:
            for d in list(self._dependents):
                d.close()
            self._before_close()
            fn = type(self)._destroy
            h, self._h = self._h, ctypes.c_void_p()
            if fn is not None:
                fn(h)
            self._keep = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
