import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))   # fake_server, the test double of the real server
