"""LangGraph's own test suite run against our savers: ``python -m tests.langgraph_suite``."""
