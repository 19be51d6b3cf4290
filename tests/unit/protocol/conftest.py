"""Import kafka-python's protocol through ``protocol.codec`` first: its schema loader emits
a DeprecationWarning at import time, which the warnings-as-errors test run would turn into
a collection error in any test module that imports ``kafka.protocol`` directly."""

import protocol.codec  # noqa: F401
