"""Input pipelines: `images` (digits, TFDS, image folders) and `text` (dates, parallel
text files, TFDS translation), each with per-host sharding, exact resume and masked eval."""
