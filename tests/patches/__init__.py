"""User patch modules for tests (`module:function`, called by the plugin in every vLLM process)."""
