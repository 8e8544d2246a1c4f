"""Run a script (``python bench/experiments/exit_no_handler.py script.py args...``) with
kvstore_ext's exit handler (kvstore_ext/shutdown.py) switched off: how jobs of our
types ended before it existed. bench/exit_repeat.py uses it for its
``@no-exit-handler`` variants; nothing else should."""
import os
import runpy
import sys

import kvstore_ext.shutdown as shutdown

shutdown._state['registered'] = True        # track() then registers no atexit handler
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name='__main__')
