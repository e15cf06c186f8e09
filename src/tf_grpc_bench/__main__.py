from tf_grpc_bench.cli import main

raise SystemExit(main())
