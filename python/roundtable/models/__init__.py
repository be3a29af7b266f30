"""Model providers: LangChain chat models behind one small interface, plus the offline model."""
