"""How the report shows what it found: tables as Markdown and HTML, the sections' layout (:mod:`.render`) and the
figures (:mod:`.plots`)."""
