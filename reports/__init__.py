"""Report writers: JSON (versioned schema), Markdown, HTML, JUnit, SARIF."""
