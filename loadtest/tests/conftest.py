import sys
from pathlib import Path

# loadtest/ holds scripts, not a package: make ``import sse_client`` / ``import relay_bench`` work
# (importlib import mode does not put test or script directories on sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
