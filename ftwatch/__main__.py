from ftwatch.cli import main
import sys
sys.exit(main())
