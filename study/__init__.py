"""The miniature study (``graftkit demo``): its design, the pipeline that runs it, and the findings rules."""
