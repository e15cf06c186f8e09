"""Recorders: see the bytes that training tasks send each other, and fold them into calls.

* ``recorder`` - the face both recorders show a capture (``Recorder``) and
  their names (``preload``, ``proxy``);
* ``wiretap`` (+ ``wiretap.c``) - the in-process recorder (``LD_PRELOAD``);
* ``tapfile`` - its record files (``TapFile``) and their reader;
* ``tapcalls`` - its record files -> calls, both sides of each connection paired;
* ``proxy`` - the recording TCP proxy, one per task (``ProxySet``);
* ``http2`` - the passive HTTP/2 and gRPC framing follower both use
  (``hyperframe``/``hpack``);
* ``calls`` - HTTP/2 events -> ``RecordedCall`` records, shared by both.

May import ``tf_grpc_bench`` core modules (errors) and each other; never
``assembly``, ``launch``, the capture sequence or TensorFlow.
"""
