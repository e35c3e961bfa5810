"""The base of every wrapper that owns a C handle: close() is idempotent,
a closed handle raises StateError instead of reaching the library, and
every handle is a context manager.

Closing is safe against calls in flight on other threads. ctypes releases
the GIL during a foreign call, so without care close() could destroy the C
object while another thread's call still runs on it. Every library call
that takes a handle therefore goes through ``call`` (or ``Handle._call``,
``Handle._create``), which holds a *use* of each Handle among its
arguments for exactly the duration of the C call:

- a use is refused with StateError ("... is closed") once close() began;
- close() marks the handle closing, closes its borrowers (dependents),
  wakes the calls in flight where the library has a safe way to
  (``_wake``: a PD endpoint aborts the rooms being waited on, a cache
  cancels the tasks being waited on, a group being created interrupts the
  net its handshake waits on), waits for the calls in flight on
  other threads to return (every library wait has a deadline, so this is
  bounded), and only then destroys the C object;
- a handle that borrows another (``_borrow``: a connector its cache and
  group, an endpoint its engine, ...) holds a use of it from before its own
  creation until its own destruction.

close() never waits for a call the *calling thread* is itself inside (a
signal handler or a callback that runs between a C call and the end of its
use) nor in ``__del__``: then the handle is marked closed at once (new
calls raise StateError) and the C object is destroyed when the last use
ends, by the thread that ends it. The same holds when a borrower could only
be destroyed later: the owner's destruction follows the borrower's.

``Handle.handle`` still gives the raw pointer for code that calls the
library itself; such calls are not protected against a concurrent close.
"""
import ctypes
import threading
import weakref
from collections import Counter
from contextlib import contextmanager

from .errors import STATUS, StateError

_OPEN, _CLOSING, _CLOSED = 0, 1, 2

_tls = threading.local()  # .held: uses this thread holds, over every handle


def _held():
    return getattr(_tls, "held", 0)


class Handle:
    """Owns one opaque C handle; ``with`` closes it."""

    _destroy = None  # the library's destroy function, set by subclasses

    def __init__(self):
        self._h = ctypes.c_void_p()
        self._keep = []  # objects the C side points into
        self._dependents = weakref.WeakSet()  # handles that borrow this one
        self._owners = []  # handles this one borrows (a use of each until destroyed)
        self._cv = threading.Condition(threading.Lock())
        self._state = _OPEN
        self._closer = None  # thread ident of the close() that runs
        self._uses = Counter()  # thread ident -> calls in flight on that thread
        self._borrowers = 0  # handles borrowing this one that are not destroyed yet
        self._waiting = Counter()  # what the calls in flight wait for (see _wake)
        self._destroy_pending = False  # close() left the destruction to the last use

    # ------------------------------------------------------------------
    # uses

    def _closed_error(self):
        return StateError(STATUS["ESTATE"], "%s is closed" % type(self).__name__)

    def _acquire(self, key=None, creating=False):
        """One use of this handle by the calling thread (StateError once
        close() began). key: what the call waits for, given to _wake."""
        me = threading.get_ident()
        with self._cv:
            if self._state != _OPEN or (not creating and not self._h):
                raise self._closed_error()
            self._uses[me] += 1
            if key is not None:
                self._waiting[key] += 1
        _tls.held = _held() + 1

    def _release(self, key=None):
        me = threading.get_ident()
        _tls.held = _held() - 1
        with self._cv:
            self._uses[me] -= 1
            if not self._uses[me]:
                del self._uses[me]
            if key is not None:
                self._waiting[key] -= 1
                if not self._waiting[key]:
                    del self._waiting[key]
            if self._state != _OPEN:  # a close() may be waiting for this use
                self._cv.notify_all()
            run = self._take_pending_locked()
        if run:
            self._finish()

    @contextmanager
    def _use(self, key=None):
        """Holds one use of this handle for the duration of the block and
        yields the raw pointer (valid until the block ends)."""
        self._acquire(key)
        try:
            yield self._h
        finally:
            self._release(key)

    def _call(self, fn, *args):
        """fn(this handle's pointer, *args) while holding a use of this handle
        and of every other Handle among args (each replaced by its pointer)."""
        return call(fn, self, *args)

    def _call_waiting(self, key, fn, *args):
        """_call for a call that blocks until `key` (a room, a task) is done:
        close() passes the keys in flight to _wake to end them early."""
        self._acquire(key)
        try:
            return call(fn, self._h, *args)
        finally:
            self._release(key)

    def _create(self, fn, *args, key=None):
        """fn(&this handle's pointer, *args), the library's create function,
        holding a use of this handle (a close() meanwhile waits for it) and
        of every Handle among args. key: for a creation that blocks until
        `key` is done (a group's handshake on its net), as in _call_waiting:
        a close() meanwhile passes it to _wake, with this handle still NULL."""
        self._acquire(key, creating=True)
        try:
            return call(fn, ctypes.byref(self._h), *args)
        finally:
            self._release(key)

    def _adopt(self, h):
        """Takes ownership of a pointer a library call created."""
        with self._cv:
            if self._state != _OPEN:
                raise self._closed_error()
            self._h = h

    def _calls_in_flight(self):
        """How many library calls hold a use of this handle now (tests)."""
        with self._cv:
            return sum(self._uses.values())

    # ------------------------------------------------------------------
    # borrowing

    def _borrow(self, *owners):
        """Records that this handle borrows `owners`: they stay alive while it
        does, closing one of them closes this handle first, and none is
        destroyed before this handle is. Call it before creating the C object
        that points into them: StateError if one is closed already."""
        done = []
        try:
            for o in owners:
                with o._cv:
                    if o._state != _OPEN:
                        raise o._closed_error()
                    o._borrowers += 1
                    o._dependents.add(self)
                done.append(o)
        except BaseException:
            for o in done:
                o._unborrowed(self)
            raise
        with self._cv:
            self._owners.extend(owners)
        self._keep.extend(owners)

    def _unborrow(self, owner):
        """Undoes one _borrow(owner) (the creation it was for failed)."""
        with self._cv:
            self._owners.remove(owner)
            still = owner in self._owners
        self._keep.remove(owner)
        owner._unborrowed(self, forget=not still)

    def _unborrowed(self, borrower, forget=True):
        """A borrower is destroyed (or gave up borrowing): one use less."""
        with self._cv:
            self._borrowers -= 1
            if forget:
                self._dependents.discard(borrower)
            self._cv.notify_all()
            run = self._take_pending_locked()
        if run:
            self._finish()

    # ------------------------------------------------------------------
    # closing

    @property
    def handle(self):
        """The raw C pointer (a ctypes.c_void_p); raises once closed. A call
        made with it is not protected against a concurrent close(); the
        binding's own calls go through _call."""
        with self._cv:
            if self._state != _OPEN or not self._h:
                raise self._closed_error()
            return self._h

    @property
    def closed(self):
        """True once close() began (or creation failed)."""
        return self._state != _OPEN or not self._h

    def _before_close(self):
        """Hook for subclasses: runs once close() began (new calls raise),
        after the dependents were closed, before waiting for calls in flight."""

    def _wake(self, keys):
        """Hook for subclasses: ends early the calls in flight that wait for
        `keys` (see _call_waiting, and _create with a key), with the
        library's own means. Runs only when some call in flight holds a key,
        and while the C object, if any, still exists; may use self._h
        directly. During a keyed creation self._h may still be NULL (the
        create function has not returned): the override must then wake the
        call through something else it holds (a Group: its net) and never
        pass the NULL handle to the library."""

    def _after_close(self):
        """Hook for subclasses: runs at the end of close() (the C object is
        destroyed, or will be when its last use ends)."""

    def close(self):
        """Destroys the C object. Idempotent. Calls in flight on other threads
        are woken where the library allows it (see _wake) and waited for;
        new calls raise StateError."""
        self._close(wait=True)

    def _close(self, wait):
        me = threading.get_ident()
        with self._cv:
            if self._state != _OPEN:
                # Closed, or a close() runs: on another thread, let it finish
                # first (unless this thread holds uses it might wait for).
                if wait and self._closer != me and not _held():
                    self._cv.wait_for(lambda: self._state == _CLOSED)
                return
            self._state = _CLOSING
            self._closer = me
            with_dependents = list(self._dependents)
        try:
            for d in with_dependents:
                d._close(wait)
            self._before_close()
            with self._cv:
                keys = list(self._waiting)
            if keys:  # self._h may be NULL: a keyed creation (see _wake)
                try:
                    self._wake(keys)
                except Exception:  # best effort: the waits end at their deadlines anyway
                    pass
            if wait:  # the calls in flight on other threads end by their deadlines
                with self._cv:
                    self._cv.wait_for(lambda: not set(self._uses) - {me})
        finally:
            # Destroy now; or, when uses are left (this thread's own calls, a
            # borrower destroyed later, an interrupted wait), when the last
            # one ends, on the thread that ends it.
            with self._cv:
                self._destroy_pending = True
                run = self._take_pending_locked()
            try:
                if run:
                    self._finish()
            finally:
                self._after_close()

    def _take_pending_locked(self):
        """(self._cv held) True when the destruction is due now: close() began
        and no use is left; the caller then runs _finish outside the lock."""
        if self._destroy_pending and not self._uses and not self._borrowers:
            self._destroy_pending = False  # exactly once
            return True
        return False

    def _finish(self):
        fn = type(self)._destroy
        h = self._h
        try:
            if h and fn is not None:
                fn(h)
        finally:
            with self._cv:
                self._h = ctypes.c_void_p()
                owners, self._owners = self._owners, []
                self._keep = []
                self._state = _CLOSED
                self._cv.notify_all()
            for o in owners:
                o._unborrowed(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        # Never waits: a use holds a reference, so none is in flight here,
        # and a garbage collection may run this on any thread.
        try:
            if "_cv" in self.__dict__:
                self._close(wait=False)
        except Exception:
            pass


def call(fn, *args):
    """fn(*args) with every Handle among args replaced by its C pointer,
    holding a use of each for exactly the duration of the C call (StateError
    if one is closed). Every library call that takes a handle goes through
    this (or Handle._call / _call_waiting / _create)."""
    held = []
    try:
        cargs = []
        for a in args:
            if isinstance(a, Handle):
                a._acquire()
                held.append(a)
                cargs.append(a._h)
            else:
                cargs.append(a)
        return fn(*cargs)
    finally:
        for a in reversed(held):
            a._release()
