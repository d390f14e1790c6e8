"""The execution engine: `CodeExecutor`, one code action from request to result, and the gate."""
