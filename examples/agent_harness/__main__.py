import sys

from examples.agent_harness.agent import main

sys.exit(main())
