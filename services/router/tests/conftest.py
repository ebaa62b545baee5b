import sys
from pathlib import Path

# Builders live beside the tests (importlib import mode does not add test dirs to sys.path).
sys.path.insert(0, str(Path(__file__).parent))
