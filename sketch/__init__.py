"""Running id popularity (decayed count-min sketch + heavy hitters), the FAE hot-set
policy, the faust worker that publishes hot sets, and the reader the trainer uses."""

from .cms import CountMinSketch
from .follower import HotSetFollower, latest_hotset
from .heavy import HeavyHitters
from .kernels import Accumulator
from .hotset import EventSample, HotChoice, HotSet, choose_hot_set
from .keys import make_keys, table_salt
from .popularity import PopularitySketch
from .state import SketchState

__all__ = [
    "CountMinSketch", "Accumulator", "HeavyHitters", "PopularitySketch", "make_keys", "table_salt",
    "HotSet", "HotChoice", "EventSample", "choose_hot_set", "HotSetFollower", "latest_hotset", "SketchState",
]
