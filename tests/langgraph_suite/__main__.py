import sys

from tests.langgraph_suite.run import main

sys.exit(main())
