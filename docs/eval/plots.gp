set terminal pngcairo size 1000,600 font 'sans,11' noenhanced
set datafile separator ','
set key outside right
set grid
set output 'memory_vs_time.png'
set title 'Accelerator-resident KV (all cameras) vs time'
set xlabel 'video time (s)'
set ylabel 'MiB'
set logscale y
plot 'memory.csv' using 2:($3/1048576.0) with lines lw 2 lt 1 title 'full', 'memory.csv' using 2:($4/1048576.0) with lines lw 2 lt 2 title 'streaming_llm', 'memory.csv' using 2:($5/1048576.0) with lines lw 2 lt 3 title 'window_lru', 'memory.csv' using 2:($6/1048576.0) with lines lw 2 lt 4 title 'h2o', 'memory.csv' using 2:($7/1048576.0) with lines lw 2 lt 5 title 'mean_key_topk', 'memory.csv' using 2:($8/1048576.0) with lines lw 2 lt 6 title 'kvmem', 'memory.csv' using 2:($9/1048576.0) with lines lw 2 lt 7 title 'kvmem_summed', 'memory.csv' using 2:($10/1048576.0) with lines lw 2 lt 8 title 'kvmem_no_lse', 'memory.csv' using 2:($11/1048576.0) with lines lw 2 lt 9 title 'kvmem_per_head', 'memory.csv' using 2:($12/1048576.0) with lines lw 2 lt 10 title 'oracle_tokens', 'memory.csv' using 2:($13/1048576.0) with lines lw 2 lt 11 title 'exact_keys_per_head'
set output 'stored_vs_time.png'
set title 'KV kept anywhere (RAM + disk) vs time'
plot 'memory.csv' using 2:($14/1048576.0) with lines lw 2 lt 1 title 'full', 'memory.csv' using 2:($15/1048576.0) with lines lw 2 lt 2 title 'streaming_llm', 'memory.csv' using 2:($16/1048576.0) with lines lw 2 lt 3 title 'window_lru', 'memory.csv' using 2:($17/1048576.0) with lines lw 2 lt 4 title 'h2o', 'memory.csv' using 2:($18/1048576.0) with lines lw 2 lt 5 title 'mean_key_topk', 'memory.csv' using 2:($19/1048576.0) with lines lw 2 lt 6 title 'kvmem', 'memory.csv' using 2:($20/1048576.0) with lines lw 2 lt 7 title 'kvmem_summed', 'memory.csv' using 2:($21/1048576.0) with lines lw 2 lt 8 title 'kvmem_no_lse', 'memory.csv' using 2:($22/1048576.0) with lines lw 2 lt 9 title 'kvmem_per_head', 'memory.csv' using 2:($23/1048576.0) with lines lw 2 lt 10 title 'oracle_tokens', 'memory.csv' using 2:($24/1048576.0) with lines lw 2 lt 11 title 'exact_keys_per_head'
set output 'latency_vs_time.png'
set title 'Recall (selection) latency p99 per 10 s of video, primary configuration'
set ylabel 'us'
plot 'latency.csv' using 1:6 with linespoints lt 2 title 'streaming_llm p99', 'latency.csv' using 1:9 with linespoints lt 3 title 'window_lru p99', 'latency.csv' using 1:12 with linespoints lt 4 title 'h2o p99', 'latency.csv' using 1:15 with linespoints lt 5 title 'mean_key_topk p99', 'latency.csv' using 1:18 with linespoints lt 6 title 'kvmem p99', 'latency.csv' using 1:21 with linespoints lt 7 title 'kvmem_summed p99', 'latency.csv' using 1:24 with linespoints lt 8 title 'kvmem_no_lse p99', 'latency.csv' using 1:27 with linespoints lt 9 title 'kvmem_per_head p99', 'latency.csv' using 1:30 with linespoints lt 10 title 'oracle_tokens p99', 'latency.csv' using 1:33 with linespoints lt 11 title 'exact_keys_per_head p99'
unset logscale y
set output 'mass_vs_budget.png'
set title 'Cold attention mass recalled vs resident budget (W + R)'
set xlabel 'resident KV budget, all cameras (MiB)'
set ylabel 'cold mass recalled'
set yrange [0:1.05]
plot 'sweep.csv' using 4:5 with linespoints lw 2 lt 1 title 'full', 'sweep.csv' using 4:6 with linespoints lw 2 lt 2 title 'streaming_llm', 'sweep.csv' using 4:7 with linespoints lw 2 lt 3 title 'window_lru', 'sweep.csv' using 4:8 with linespoints lw 2 lt 4 title 'h2o', 'sweep.csv' using 4:9 with linespoints lw 2 lt 5 title 'mean_key_topk', 'sweep.csv' using 4:10 with linespoints lw 2 lt 6 title 'kvmem', 'sweep.csv' using 4:11 with linespoints lw 2 lt 7 title 'kvmem_summed', 'sweep.csv' using 4:12 with linespoints lw 2 lt 8 title 'kvmem_no_lse', 'sweep.csv' using 4:13 with linespoints lw 2 lt 9 title 'kvmem_per_head', 'sweep.csv' using 4:14 with linespoints lw 2 lt 10 title 'oracle_tokens', 'sweep.csv' using 4:15 with linespoints lw 2 lt 11 title 'exact_keys_per_head'
set output 'cold_mass_vs_time.png'
set title 'Cold mass recalled per 10 s of video'
set xlabel 'video time (s)'
plot 'cold_mass.csv' using 1:2 with lines lw 2 lt 1 title 'full', 'cold_mass.csv' using 1:3 with lines lw 2 lt 2 title 'streaming_llm', 'cold_mass.csv' using 1:4 with lines lw 2 lt 3 title 'window_lru', 'cold_mass.csv' using 1:5 with lines lw 2 lt 4 title 'h2o', 'cold_mass.csv' using 1:6 with lines lw 2 lt 5 title 'mean_key_topk', 'cold_mass.csv' using 1:7 with lines lw 2 lt 6 title 'kvmem', 'cold_mass.csv' using 1:8 with lines lw 2 lt 7 title 'kvmem_summed', 'cold_mass.csv' using 1:9 with lines lw 2 lt 8 title 'kvmem_no_lse', 'cold_mass.csv' using 1:10 with lines lw 2 lt 9 title 'kvmem_per_head', 'cold_mass.csv' using 1:11 with lines lw 2 lt 10 title 'oracle_tokens', 'cold_mass.csv' using 1:12 with lines lw 2 lt 11 title 'exact_keys_per_head'
