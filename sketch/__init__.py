"""Running id popularity (decayed count-min sketch + heavy hitters), the FAE hot-set
policy, the faust worker that publishes hot sets, and the reader the trainer uses."""

from typing import TYPE_CHECKING

from streamrec.foundation.lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers and IDEs; at run time each loads on first use
    from .cms import CountMinSketch
    from .follower import HotSetFollower, latest_hotset
    from .heavy import HeavyHitters
    from .hotset import EventSample, HotChoice, HotSet, choose_hot_set
    from .kernels import Accumulator
    from .keys import make_keys
    from .popularity import PopularitySketch
    from .state import CountingSpec, SketchState

# lazy: the trainer follows hot sets through HotSetFollower and must not load numba (the kernels)
_EXPORTS = {  # submodule: the public names it defines
    ".cms": "CountMinSketch",
    ".follower": "HotSetFollower latest_hotset",
    ".heavy": "HeavyHitters",
    ".hotset": "EventSample HotChoice HotSet choose_hot_set",
    ".kernels": "Accumulator",
    ".keys": "make_keys",
    ".popularity": "PopularitySketch",
    ".state": "CountingSpec SketchState",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [name for names in _EXPORTS.values() for name in names.split()]
